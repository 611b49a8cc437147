"""Sweeps of the chunk_fused kernels, for whoever tunes them next.

  configs      force each candidate config of one tuned kernel (``prep``: gate + K K^T + solve, no
               block width; ``state``: the Triton state pass with the output fused in, over warm-up
               segments where the default rule takes them; ``walk``: the state pass without it, as one
               long sequence and the pipeline run it) alone, and time the whole calls interleaved;
  fuse-output  time triton.chunk and triton.chunk_fused with the output pass (over single chunks and
               over pairs of chunks) and with it folded into the state pass, interleaved (A B C D A B C D ...);
  segments     time triton.chunk_fused (its default rules, then its sequential walk) against its walk over
               warm-up segments (``segment_chunks``, the output always folded in) at several segment sizes;
  walk         time triton.chunk_fused as the backend runs it (its default rules) against the Triton walk
               (with the default output rule, and with the output fused in) and the Gluon walks for Hopper
               (``walk="sm90"``, one call and pipelined in groups of ``-g`` chunks; ``"sm90_transposed"``;
               the default plan with its whole walks on ``"sm90"``, ``whole_walk``, where it has them);
  plans        time triton.chunk_fused against every path a plan can force (``PLANS``: the multi-kernel pipeline,
               each walk, the warp-specialized kernel, the whole walks on ``"sm90"``, the default's warm-up
               segments without and with whole walks beside them, the recurrence), whole
               calls, "-" where one cannot run the case, and name the fastest: where the default is not, a
               dispatch rule is missing;
  pipeline     time triton.chunk_fused against its pipelined call (``pipeline_chunks``: prep, walk and
               output pass, or the walk with the output fused in, group by group on their own streams)
               at several group sizes; the output is fused in or not by the kernel's default rule.

A forced config runs as given (the tuner prunes only among several), BV masked past the head dim.
Each row also gives the relative difference of its output from the first row's: every config and
variant computes the same thing, so anything above rounding is a bug (the prep config that triton 3.6
miscompiled returned NaN here). Times are the graph timer's medians with the L2 flushed, as in
``gdnbench run``; a case's rows print as soon as it is timed, so a config that kills the GPU context
leaves the earlier cases' rows.
This reaches into the kernels' internals (their TunedKernel objects) and is not part of the harness.

    python -m examples.kernel_sweeps.chunk_fused_sweep configs parity -k "B=16,T=512,H=8,HV=8,K=64" --kernel prep
    python -m examples.kernel_sweeps.chunk_fused_sweep configs parity -k "B=64,T=64" --kernel state -c 64,4,1 -c 32,8,2
    python -m examples.kernel_sweeps.chunk_fused_sweep configs parity -k "K=64" --kernel prep -c 4,1 -c 4,1,96
    python -m examples.kernel_sweeps.chunk_fused_sweep fuse-output parity
    python -m examples.kernel_sweeps.chunk_fused_sweep segments qwen3-next -k prefill -s 16 -s 32 -s 64
    python -m examples.kernel_sweeps.chunk_fused_sweep plans envelope -k prefill/

On a CPU (TRITON_INTERPRET=1, ``--device cpu``) it runs in Triton's interpreter: a correctness check of
every config, with wall-clock times that mean nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from gdnbench.backends.base import Prepared
from gdnbench.backends.triton_chunk import prepare_chunk
from gdnbench.problem import Problem, make_problem
from gdnbench.runner import select_cases
from gdnbench.suite import load_suite
from gdnbench.timing import measure_interleaved

from .common import add_case_arguments, int_tuple, rel_diff, swapped, sweep_timing, tool_parser


def sweep_configs(suite: str, pattern: str | None, kernel_name: str, configs: list[tuple[int, ...]] | None,
                  device: torch.device) -> None:
    from gdnbench_kernels import chunk

    kernel, shipped = {"prep": (chunk.prep.fused_prep_kernel, chunk.prep.PREP_CANDIDATES),
                       "state": (chunk.state.fused_state_kernel, chunk.state.FUSED_STATE_CANDIDATES),
                       "walk": (chunk.state.state_kernel, chunk.state.STATE_CANDIDATES)}[kernel_name]
    fuse_output = {"prep": None, "state": True, "walk": False}[kernel_name]  # None: the default rule's
    walk = None if kernel_name == "prep" else "triton"  # the Triton kernels whose configs are forced
    forced = [[chunk.configs.config_from(c, block=kernel_name != "prep")] for c in configs or shipped]
    s = load_suite(suite)
    for case in [c for c in select_cases(s, pattern) if c.op == "prefill"]:
        p = make_problem(case, s.seed, device)
        runs = []
        segments = None
        if kernel_name == "state":  # where the backend runs it: over warm-up segments where the default rule takes them
            layout = chunk.ChunkLayout.build(p.q.shape[0], p.q.shape[1], p.cu_seqlens, device)
            segments = chunk.plan.warm_up_default(layout, case.HV, case.V, device)
        for cfg in forced:  # each its own workspace, so that one config's stale results cannot pass for another's
            with swapped(kernel, configs=cfg, cache={}):
                # the Triton prep kernel, also where the Gluon one would run by default
                prepared = prepare_chunk(p, fused=True, fuse_output=fuse_output, walk=walk, segment_chunks=segments,
                                    prep="triton")

            def call(cfg=cfg, prepared=prepared) -> None:
                with swapped(kernel, configs=cfg, cache={}):
                    prepared.call()
            runs.append((cfg[0], prepared, call))
        outs = []
        for _, prepared, call in runs:
            call()
            outs.append(prepared.outputs().o.clone())
        ms = measure_interleaved([(call, prepared.reset) for _, prepared, call in runs], device=device,
                                 config=sweep_timing(device))
        for (cfg, _, _), m, o in zip(runs, ms, outs):
            print(f"{case.id}  {kernel_name}[{chunk.configs.config_label(cfg)}]  {np.median(m.samples_us):9.1f} us"
                  f"  diff {rel_diff(o, outs[0]):.1e}", flush=True)


def _sweep_variants(suite: str, pattern: str | None, device: torch.device, names: list[str],
                    variants: Callable[[Problem], list[Prepared | None]]) -> None:
    """Times ``variants(problem)`` interleaved on every prefill case, one row per case ("-" for a variant that
    cannot run the case, None)."""
    s = load_suite(suite)
    print("case  N*HV  longest  " + "  ".join(names) + "  (us)  max diff")
    for case in [c for c in select_cases(s, pattern) if c.op == "prefill"]:
        p = make_problem(case, s.seed, device)
        listed = variants(p)
        prepared = [v for v in listed if v is not None]
        for v in prepared:
            v.call()
        outs = [v.outputs().o.clone() for v in prepared]
        ms = iter(measure_interleaved([(v.call, v.reset) for v in prepared], device=device,
                                      config=sweep_timing(device)))
        lens = [case.T] * case.B if p.cu_seqlens is None else (p.cu_seqlens[1:] - p.cu_seqlens[:-1]).tolist()
        medians = [None if v is None else float(np.median(next(ms).samples_us)) for v in listed]
        times = "  ".join("        -" if m is None else f"{m:9.1f}" for m in medians)
        print(f"{case.id}  {len(lens) * case.HV}  {max(lens)}  {times}  {max(rel_diff(o, outs[0]) for o in outs):.1e}",
              flush=True)
        timed = [(m, name) for m, name in zip(medians, names) if m is not None]
        fastest, name = min(timed)
        print(f"  fastest: {name}; the first column at {timed[0][0] / fastest:.2f}x its time", flush=True)


def _where_it_runs(p: Problem, fused: bool = True, **forced: Any) -> Prepared | None:
    """``prepare_chunk(p, fused=fused, **forced)``, or None where those fields cannot run the case."""
    try:
        return prepare_chunk(p, fused=fused, **forced)
    except ValueError:
        return None


def sweep_fuse_output(suite: str, pattern: str | None, device: torch.device) -> None:
    _sweep_variants(suite, pattern, device, ["triton.chunk", "fused+output pass", "fused+output pass per 2 chunks",
                                             "fused, output in state pass"],
                    lambda p: [prepare_chunk(p, fused=False),
                               prepare_chunk(p, fused=True, fuse_output=False, output_span=1, pipeline_chunks=0),
                               prepare_chunk(p, fused=True, fuse_output=False, output_span=2, pipeline_chunks=0),
                               prepare_chunk(p, fused=True, fuse_output=True)])


def sweep_segments(suite: str, pattern: str | None, device: torch.device, sizes: list[int]) -> None:
    names = ["fused", "sequential"] + [f"warm-up{c}" for c in sizes]
    _sweep_variants(suite, pattern, device, names,
                    lambda p: [prepare_chunk(p, fused=True), prepare_chunk(p, fused=True, segment_chunks=0)] +
                    [prepare_chunk(p, fused=True, segment_chunks=c) for c in sizes])


def sweep_pipeline(suite: str, pattern: str | None, device: torch.device, sizes: list[int]) -> None:
    _sweep_variants(suite, pattern, device, ["fused"] + [f"groups of {c}" for c in sizes],
                    lambda p: [prepare_chunk(p, fused=True, pipeline_chunks=0)] +
                    [prepare_chunk(p, fused=True, pipeline_chunks=c) for c in sizes])


def sweep_walk(suite: str, pattern: str | None, device: torch.device, sizes: list[int]) -> None:
    _sweep_variants(suite, pattern, device,
                    ["default", "triton", "triton fused", "sm90", "sm90_transposed", "whole walks on sm90"] +
                    [f"sm90 groups of {c}" for c in sizes],
                    lambda p: [prepare_chunk(p, fused=True),
                               prepare_chunk(p, fused=True, walk="triton"),
                               prepare_chunk(p, fused=True, walk="triton", fuse_output=True),
                               prepare_chunk(p, fused=True, walk="sm90", pipeline_chunks=0),
                               prepare_chunk(p, fused=True, walk="sm90_transposed", pipeline_chunks=0),
                               _where_it_runs(p, whole_walk="sm90")] +
                    [prepare_chunk(p, fused=True, walk="sm90", pipeline_chunks=c) for c in sizes])


# every path of the bundled chunked kernels that a plan can force, whole calls (the multi-kernel pipeline is
# triton.chunk's; the recurrence only on sequences of up to PLANS_RECURRENT_MAX_TOKENS tokens, where it can pay)
PLANS: list[tuple[str, dict[str, Any]]] = [
    ("default", {}), ("stages", {"fused": False}), ("triton", {"walk": "triton"}),
    ("triton+out", {"walk": "triton", "fuse_output": True}), ("sm90", {"walk": "sm90", "pipeline_chunks": 0}),
    ("sm90_transposed", {"walk": "sm90_transposed", "pipeline_chunks": 0}),
    ("specialized", {"walk": "sm90_specialized"}), ("whole-on-sm90", {"whole_walk": "sm90"}),
    ("no-whole-walks", {"whole_walks": False}), ("whole-walks", {"whole_walks": True}),
    ("recurrent", {"walk": "recurrent"}),
]
PLANS_RECURRENT_MAX_TOKENS = 1024


def sweep_plans(suite: str, pattern: str | None, device: torch.device) -> None:
    """Every plan of PLANS that can run each case, forced one at a time beside the default."""
    def variants(p: Problem) -> list[Prepared | None]:
        longest = p.case.T if p.cu_seqlens is None else int((p.cu_seqlens[1:] - p.cu_seqlens[:-1]).max())
        return [None if forced.get("walk") == "recurrent" and longest > PLANS_RECURRENT_MAX_TOKENS
                else _where_it_runs(p, **forced) for _, forced in PLANS]

    _sweep_variants(suite, pattern, device, [name for name, _ in PLANS], variants)


def main(argv: list[str] | None = None) -> None:
    parser = tool_parser(__doc__)
    sub = parser.add_subparsers(dest="sweep", required=True)
    for name, help_ in (("configs", "force each candidate config of one kernel"),
                        ("fuse-output", "output pass vs output folded into the state pass"),
                        ("segments", "the sequential state walk vs warm-up segments"),
                        ("pipeline", "one call vs prep, walk and output pass overlapped group by group"),
                        ("walk", "the Triton walk vs the Gluon ones for Hopper, the output fused in"),
                        ("plans", "every path a plan can force, whole calls, beside the default")):
        cmd = sub.add_parser(name, help=help_)
        add_case_arguments(cmd)
        if name == "configs":
            cmd.add_argument("--kernel", choices=["prep", "state", "walk"], default="prep")
            cmd.add_argument("-c", "--config", type=int_tuple("[BV,]WARPS,STAGES[,MAXNREG]", "64,4,1", (2, 3, 4)),
                             action="append", help="a config to force, WARPS,STAGES[,MAXNREG] for prep and "
                                                   "BV,WARPS,STAGES[,MAXNREG] for state and walk (repeatable; "
                                                   "default: the shipped candidates; MAXNREG caps registers "
                                                   "per thread)")
        if name == "segments":
            cmd.add_argument("-s", "--segment-chunks", type=int, action="append",
                             help="chunks per segment (repeatable; default: 16, 32, 64)")
        if name in ("pipeline", "walk"):
            cmd.add_argument("-g", "--group-chunks", type=int, action="append",
                             help="chunks per group, even (repeatable; default: 32, 64, 128 for pipeline, "
                                  "none for walk)")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if args.sweep == "configs":
        lengths = (2, 3) if args.kernel == "prep" else (3, 4)
        for c in args.config or []:
            if len(c) not in lengths:
                parser.error(f"--kernel {args.kernel} takes {'' if args.kernel == 'prep' else 'BV,'}"
                             f"WARPS,STAGES[,MAXNREG] configs, got {','.join(map(str, c))}")
        sweep_configs(args.suite, args.filter, args.kernel, args.config, device)
    elif args.sweep == "fuse-output":
        sweep_fuse_output(args.suite, args.filter, device)
    elif args.sweep == "pipeline":
        sweep_pipeline(args.suite, args.filter, device, args.group_chunks or [32, 64, 128])
    elif args.sweep == "walk":
        sweep_walk(args.suite, args.filter, device, args.group_chunks or [])
    elif args.sweep == "plans":
        sweep_plans(args.suite, args.filter, device)
    else:
        sweep_segments(args.suite, args.filter, device, args.segment_chunks or [16, 32, 64])


if __name__ == "__main__":
    main()
