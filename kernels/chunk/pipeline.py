"""A pipelined call: prep, walk and output pass group by group, overlapped on three streams."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .launch import Launch
from .layout import CHUNK, ChunkLayout
from .output import output_kernel_for, output_pass
from .prep import run_prep
from .state import state_kernel, state_pass, walk_with_output


@dataclass(frozen=True)
class PipelineLayout:
    """A batch's chunks in groups, for a pipelined call: group g takes chunks [g * chunks, (g + 1) * chunks)
    of every sequence (an even number, so that no pair of the output pass straddles two groups; empty
    for sequences already done). Group g's walk (the state pass, on a high-priority stream) waits only
    for group g's prep kernel, which ran beside group g - 1's walk, and group g's output pass (unless the
    output is fused into the walk) runs as soon as its walk is done, beside the next walk. A walk hands
    each sequence's state to the next group's through an fp32 buffer, the values it kept in registers,
    so the results are those of one walk. Built on the host once, outside timed calls."""

    spans: tuple[tuple[int, int], ...]  # the batch's sequences, as in its ChunkLayout
    groups: tuple[ChunkLayout, ...]

    @classmethod
    def build(cls, layout: ChunkLayout, chunks: int) -> PipelineLayout:
        if chunks < 2 or chunks % 2:
            raise ValueError(f"a pipeline group takes an even number of chunks, got {chunks}")
        if layout.max_len == 0:
            raise ValueError("nothing to pipeline: every sequence is empty")
        span, device = chunks * CHUNK, layout.seq_bounds.device
        return cls(spans=layout.spans, groups=tuple(
            ChunkLayout.from_spans([(min(s + t, e), min(s + t + span, e)) for s, e in layout.spans], layout.tokens,
                                   device)
            for t in range(0, layout.max_len, span)))

    def firsts(self, span: int) -> list[int]:
        """Each group's first block of ``span`` chunks in the batch's numbering (groups in turn, each
        sequence-major): where its chunks' scratch and entering states sit in the workspace."""
        firsts = [0]
        for group in self.groups[:-1]:
            firsts.append(firsts[-1] + group.blocks(span)[0])
        return firsts


_STREAMS: dict[int, tuple[torch.cuda.Stream, torch.cuda.Stream, torch.cuda.Stream]] = {}


def _pipeline_streams(device: torch.device) -> tuple[torch.cuda.Stream, torch.cuda.Stream, torch.cuda.Stream]:
    """(walk, prep, output) streams of a device, made once: the walk is the critical path, so its stream
    has the higher priority (its programs are scheduled first when an SM frees up)."""
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
    walk_s, prep_s, out_s = _pipeline_streams(x.q.device)
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
