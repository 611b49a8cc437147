"""Force each candidate config of the bundled recurrent kernel (triton.recurrent), timed side by side.

For whoever tunes the kernel next. For every case of SUITE that matches -k, each (BV, warps, items) config
runs alone, the kernel's tuner bypassed: the shipped candidates (pruned for the case's head dims as the
tuner prunes them) or those given with -c. All configs of a case are timed interleaved (A B C A B C ...)
with ``gdnbench run``'s timer (graph replay, L2 flushed), the state pool reset before every sample. One row
per config: median us, time relative to the case's fastest config, and the relative difference of its output
and state from the first config's (every config computes the same thing, so anything above rounding is a
bug). This reaches into the kernel module's tuning state and is not part of the harness.

    python -m examples.kernel_sweeps.recurrent_sweep decode -k "B=256,T=4,H=16,HV=32"
    python -m examples.kernel_sweeps.recurrent_sweep decode -k "B=256,T=2" -c 8,1,1 -c 8,1,4 -c 64,4,1

With ``--copies``, two copies are timed in the same alternation on a pool case, as rows ``copy`` and
``slot-copy`` (their "vs fastest": copy time / the fastest config's, so 0.95 means that config runs at 95%
of the copy's rate): gdnbench's copy reference (``--copy-reference``: a contiguous copy of the case's bytes)
and an in-place bitwise NOT of each slot the case touches (in a pool of the same shape), which reads and
writes where the kernel does, without its math. On an H100 that put the scattered-slot rows' ceiling 2%
under the contiguous copy's.

    python -m examples.kernel_sweeps.recurrent_sweep decode -k "slots=scattered" --copies

On a CPU (TRITON_INTERPRET=1, ``--device cpu``) it runs in Triton's interpreter: a correctness check of
every config, with wall-clock times that mean nothing.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
import triton
import triton.language as tl

from gdnbench import roofline
from gdnbench.backends.triton_recurrent import triton_recurrent
from gdnbench.problem import make_problem
from gdnbench.runner import select_cases
from gdnbench.suite import load_suite
from gdnbench.timing import copy_moving, measure_interleaved

from .common import add_case_arguments, int_tuple, rel_diff, swapped, sweep_timing, tool_parser


# Bytes per program of the slot copy: 4 KB (2048 bf16 or 1024 fp32 elements) with 4 warps was within 1% of the
# fastest of 512-8192 elements and 2-8 warps for both dtypes, contiguous and scattered slots, on an H100 and an
# H200; 8 KB of fp32 ran 5% slower on the H200.
SLOT_COPY_BYTES = 4096


@triton.jit
def _slot_not_kernel(pool, slots, SLOT: tl.constexpr, BLOCK: tl.constexpr):
    """Bitwise NOT, in place, of BLOCK elements of the slot ``slots[program // blocks per slot]``."""
    per_slot: tl.constexpr = (SLOT + BLOCK - 1) // BLOCK
    i = tl.program_id(0)
    offs = (i % per_slot) * BLOCK + tl.arange(0, BLOCK)
    p = pool + tl.load(slots + i // per_slot).to(tl.int64) * SLOT + offs
    tl.store(p, ~tl.load(p, mask=offs < SLOT), mask=offs < SLOT)


def slot_copy(pool: torch.Tensor, slots: torch.Tensor) -> Callable[[], object]:
    """A launch reading and writing each of ``slots`` (distinct, >= 0) of ``pool`` once, in place: the pool
    traffic of a decode step on those slots, without its math. Each call flips the slots' bits."""
    bits = pool.view({2: torch.int16, 4: torch.int32}[pool.element_size()])
    slot, block = bits[0].numel(), SLOT_COPY_BYTES // pool.element_size()
    grid = (slots.numel() * triton.cdiv(slot, block),)
    return lambda: _slot_not_kernel[grid](bits, slots, SLOT=slot, BLOCK=block, num_warps=4)


def sweep(suite: str, pattern: str | None, configs: list[tuple[int, int, int]] | None, device: torch.device,
          copies: bool = False) -> None:
    from gdnbench_kernels.recurrent import forward as kern

    s = load_suite(suite)
    print("case  BV/warps x items  us  vs fastest  diff o  diff state")
    for case in select_cases(s, pattern):
        reason = triton_recurrent.unsupported(case, device)
        if reason:
            print(f"{case.id}  SKIP: {reason}")
            continue
        if configs:
            cands = [triton.Config({"BV": c[0], "ITEMS": c[2]}, num_warps=c[1], num_stages=2,
                                   maxnreg=c[3] if len(c) > 3 else None) for c in configs]
        else:
            cands = kern.tuning_candidates(case.K, case.V)
        p = make_problem(case, s.seed, device)
        written = p.slot_idx.reshape(-1).long() if p.slot_idx is not None else None
        written = None if written is None else written[written >= 0].unique()  # a pool's touched slots
        # one prepared problem (inputs, pool and its pristine copy) serves every config: a pool of
        # B=512 is 2 GiB, two per config would not fit
        with swapped(kern, CONFIGS=cands[:1], _TUNED={}):
            prepared = triton_recurrent.prepare(p)
        runs = []
        for c in cands:
            def call(c=c) -> None:
                with swapped(kern, CONFIGS=[c], _TUNED={}):  # every launch inside runs c
                    prepared.call()
            runs.append((c, call))
        ref, diffs = None, []
        for _, call in runs:  # each config once, from the initial state, compared with the first config's
            call()
            out = prepared.outputs()
            state = out.state_pool[written] if out.state_pool is not None else out.final_state
            if ref is None:
                ref = (out.o.clone(), None if state is None else state.clone())
            diffs.append((rel_diff(out.o, ref[0]), "-" if state is None else f"{rel_diff(state, ref[1]):.1e}"))
            if prepared.reset is not None:
                prepared.reset()
        timed = [(call, prepared.reset) for _, call in runs]
        references = []
        if copies and written is not None:
            references = ["copy", "slot-copy"]
            timed += [(copy_moving(int(roofline.traffic(case)[0]), device), None),
                      (slot_copy(torch.empty_like(p.state_pool), written.to(torch.int32)), None)]
        ms = measure_interleaved(timed, device=device, config=sweep_timing(device))
        medians = [float(np.median(m.samples_us)) for m in ms]
        fastest = min(medians[:len(runs)])
        for (c, _), t, (d_o, d_state) in zip(runs, medians, diffs):
            label = f"{c.kwargs['BV']}/{c.num_warps}x{c.kwargs['ITEMS']}" + (f"r{c.maxnreg}" if c.maxnreg else "")
            print(f"{case.id}  {label}  {t:9.1f}  {t / fastest:.3f}  {d_o:.1e}  {d_state}", flush=True)
        for label, t in zip(references, medians[len(runs):]):
            print(f"{case.id}  {label}  {t:9.1f}  {t / fastest:.3f}  -  -", flush=True)


def main(argv: list[str] | None = None) -> None:
    parser = tool_parser(__doc__)
    add_case_arguments(parser)
    parser.add_argument("-c", "--config", type=int_tuple("BV,WARPS,ITEMS[,MAXNREG]", "8,1,4", lengths=(3, 4)),
                        action="append", help="BV,WARPS,ITEMS[,MAXNREG] to force, MAXNREG a register cap per "
                                              "thread (repeatable; default: the shipped candidates)")
    parser.add_argument("--copies", action="store_true",
                        help="on pool cases, also time gdnbench's copy reference and an in-place copy of the "
                             "case's slots (rows copy and slot-copy)")
    args = parser.parse_args(argv)
    sweep(args.suite, args.filter, args.config, torch.device(args.device), args.copies)


if __name__ == "__main__":
    main()
