"""Launch configs of the tuned chunk kernels: candidates as tuples, block widths, labels for result rows."""

from __future__ import annotations

import triton

from ..common.interpreter import triton_interpreter_on
from ..common.ints import next_power_of_2


def tile_width(n: int) -> int:
    """The tile width for a head dim: the next power of two, at least 16 (tl.dot's minimum)."""
    return max(16, next_power_of_2(n))


def bv_prune(configs, named_args):
    """BV no wider than V needs (duplicates dropped)."""
    V = named_args["V"]
    keep, seen = [], set()
    for c in configs:
        c = with_bv(c, min(c.kwargs["BV"], tile_width(V)))
        if config_settings(c) not in seen:
            seen.add(config_settings(c))
            keep.append(c)
    return keep


def with_bv(c: triton.Config, bv: int) -> triton.Config:
    """c with block width bv, every other setting (warps, stages, register cap) kept."""
    return triton.Config({**c.kwargs, "BV": bv}, num_warps=c.num_warps, num_stages=c.num_stages, maxnreg=c.maxnreg)


def config_settings(c: triton.Config) -> tuple:
    """What tells two configs apart (the prune functions drop duplicates)."""
    return c.kwargs["BV"], c.num_warps, c.num_stages, c.maxnreg


def make_configs(candidates: list[tuple[int, ...]], block: bool = True) -> list[triton.Config]:
    """(BV, num_warps, num_stages[, maxnreg]) candidates on a GPU (maxnreg: ptxas's register cap per
    thread, more programs per SM for some spills), without BV for a kernel with no block width (not
    ``block``); one config (BV 32, 4 warps) in the interpreter, where nothing is tuned and
    BV 32 still splits V = 60 / 64 into two blocks."""
    if triton_interpreter_on():
        return [triton.Config({"BV": 32} if block else {}, num_warps=4, num_stages=1)]
    return [config_from(c, block) for c in candidates]


def config_from(candidate: tuple[int, ...], block: bool = True) -> triton.Config:
    """The triton config of one (BV, num_warps, num_stages[, maxnreg]) candidate, as it is; without BV
    (num_warps, num_stages[, maxnreg]) when not ``block``."""
    bv, (warps, stages, *cap) = (candidate[0], candidate[1:]) if block else (None, candidate)
    return triton.Config({} if bv is None else {"BV": bv}, num_warps=warps, num_stages=stages,
                         maxnreg=cap[0] if cap else None)


def config_label(cfg: triton.Config) -> str:
    """A chunk kernel's config as result rows print it: "BV=64 w4 s1" ("w4 s1" without a block width),
    " r128" added for a register cap."""
    bv = f"BV={cfg.kwargs['BV']} " if "BV" in cfg.kwargs else ""
    return f"{bv}w{cfg.num_warps} s{cfg.num_stages}" + (f" r{cfg.maxnreg}" if cfg.maxnreg else "")


def config_str(kernel) -> str:
    """The config a TunedKernel ran last (the only one under the interpreter)."""
    cfg = getattr(kernel, "best_config", None) or (kernel.configs[0] if len(kernel.configs) == 1 else None)
    return "not tuned yet" if cfg is None else config_label(cfg)
