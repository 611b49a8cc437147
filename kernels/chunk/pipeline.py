"""A pipelined call (``layout.PipelineLayout``): prep, walk and output pass group by group, on three streams."""

from __future__ import annotations

import torch

from .launch import Launch
from .layout import PipelineLayout
from .output import output_kernel_for, output_pass
from .prep import run_prep
from .state import state_kernel, state_pass, walk_with_output


_STREAMS: dict[int, tuple[torch.cuda.Stream, torch.cuda.Stream, torch.cuda.Stream]] = {}


def pipeline_streams(device: torch.device) -> tuple[torch.cuda.Stream, torch.cuda.Stream, torch.cuda.Stream]:
    """(walk, prep, output) streams of a device, made once: the walk is the critical path, so its stream
    has the higher priority (its programs are scheduled first when an SM frees up). The whole walks beside warm-up
    segments take the first too (``forward``)."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _STREAMS:
        low, high = torch.cuda.Stream.priority_range()
        _STREAMS[index] = (torch.cuda.Stream(device, priority=high), torch.cuda.Stream(device, priority=low),
                           torch.cuda.Stream(device, priority=low))
    return _STREAMS[index]


def run_pipelined(x: Launch, pipe: PipelineLayout, fuse_output: bool, output_final_state: bool, walk: str,
                  prep_kernel: str) -> None:
    """Prep, walk and output pass group by group (see PipelineLayout); on a GPU the three run on their
    own streams, forked from and joined back into the caller's (CUDA-graph capturable)."""
    ws, last = x.ws, len(pipe.groups) - 1
    chunk_firsts, block_firsts = pipe.firsts(1), pipe.firsts(x.span)

    def prep(g: int) -> None:
        run_prep(x, pipe.groups[g], prep_kernel, chunk_firsts[g])

    def walk_group(g: int) -> None:
        ht = (ws.final_state if output_final_state else None) if g == last else ws.handoff[g % 2]
        h0 = x.h0 if g == 0 else ws.handoff[(g - 1) % 2]
        if fuse_output:
            walk_with_output(x, pipe.groups[g], h0, ht, walk)
        else:
            state_pass(x, state_kernel, pipe.groups[g], h0, ht, h=ws.h[block_firsts[g]:])

    def output(g: int) -> None:
        output_pass(x, output_kernel_for(x.span), pipe.groups[g], h=ws.h[block_firsts[g]:])

    if x.q.device.type != "cuda":
        for g in range(last + 1):
            prep(g)
            walk_group(g)
            if not fuse_output:
                output(g)
        return
    main = torch.cuda.current_stream(x.q.device)
    walk_s, prep_s, out_s = pipeline_streams(x.q.device)
    streams = (walk_s, prep_s) if fuse_output else (walk_s, prep_s, out_s)  # forked and joined: the used ones
    for s in streams:
        s.wait_stream(main)
    prepped = {g: torch.cuda.Event() for g in range(1, last + 1)}  # group 0's prep runs on the walk's stream
    with torch.cuda.stream(walk_s):
        prep(0)
    with torch.cuda.stream(prep_s):
        for g, event in prepped.items():
            prep(g)
            event.record()
    for g in range(last + 1):
        with torch.cuda.stream(walk_s):
            if g:
                walk_s.wait_event(prepped[g])
            walk_group(g)
        if not fuse_output:
            walked = torch.cuda.Event()
            walked.record(walk_s)
            with torch.cuda.stream(out_s):
                out_s.wait_event(walked)
                output(g)
    for s in streams:
        main.wait_stream(s)
