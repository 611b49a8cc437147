"""Backends that misbehave on purpose, to test the harness's own handling of failures.

Suites in the tests name them as ``tests.fake_backends:NAME``.
"""

import os
import signal
import time
from dataclasses import replace

import torch
import triton
import triton.language as tl

from gdnbench.backends import Outputs, Prepared, backend
from gdnbench.backends.torch_common import prepare as reference_prepare
from gdnbench.backends.torch_common import solve

ANY = dict(ops={"prefill", "decode"}, devices={"cpu", "cuda"}, gating={"pre", "raw"})


def _wrapped(p, change):
    """The fp32 reference, with its outputs passed through ``change``."""
    inner = reference_prepare(p, "recurrent")
    return Prepared(inner.call, lambda: change(inner.outputs()), inner.reset, "fake")


@backend("fake.ok", **ANY)
def ok(p):
    return _wrapped(p, lambda out: out)


# a backend built on Triton: on a CPU its rows are interpreted (correctness only)
triton_ok = replace(ok, name="fake.triton", triton=True)


@backend("fake.raises", **ANY)
def raises(p):
    raise RuntimeError("boom: the kernel exploded")


@backend("fake.nan", **ANY)
def nan(p):
    return _wrapped(p, lambda out: Outputs(torch.full_like(out.o, float("nan")), out.final_state, out.state_pool))


@backend("fake.wrong", **ANY)
def wrong(p):
    return _wrapped(p, lambda out: Outputs(out.o * 1.1, out.final_state, out.state_pool))


@backend("fake.oom", **ANY)
def oom(p):
    raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1 TiB")


@backend("fake.slow", **ANY)
def slow(p):
    def call():
        time.sleep(30)

    return Prepared(call, lambda: None)


@backend("fake.missing", requires=("no_such_module_for_gdnbench",), **ANY)
def missing(p):
    raise AssertionError("never prepared: its module does not import")


@backend("fake.clobber", **ANY)
def clobber(p):
    """Decode backend that also writes a slot it was not given."""

    def change(out):
        pool = out.state_pool.clone()
        untouched = [s for s in range(pool.shape[0]) if s not in set(p.slot_idx.tolist())]
        pool[untouched[0]] += 1
        return Outputs(out.o, out.final_state, pool)

    return _wrapped(p, change)


@backend("fake.stale", **ANY)
def stale(p):
    """Right on its first call; every later call (the timed ones) does nothing."""
    inner = reference_prepare(p, "recurrent")
    calls = []

    def call():
        calls.append(1)
        if len(calls) == 1:
            inner.call()

    return Prepared(call, inner.outputs, inner.reset, "fake")


@backend("fake.pool_writer", **ANY)
def pool_writer(p):
    """Decode in place on the problem's own state_pool (not a copy), and one slot outside slot_idx written."""
    outside = next(s for s in range(p.state_pool.shape[0]) if s not in set(p.slot_idx.tolist()))
    result = {}

    def call():
        result["out"] = solve(p, "recurrent", torch.float32, state_pool=p.state_pool)
        p.state_pool[outside] += 1

    return Prepared(call, lambda: result["out"], path="fake")


def _zero_tokens(p, tokens):
    """The reference with the output of ``tokens`` (indices into the packed tokens) zeroed."""

    def change(out):
        o = out.o.clone()
        o[:, tokens] = 0
        return Outputs(o, out.final_state, out.state_pool)

    return _wrapped(p, change)


@backend("fake.drop_short", **ANY)
def drop_short(p):
    """Zero output for the shortest sequence of a varlen pack."""
    lens = (p.cu_seqlens[1:] - p.cu_seqlens[:-1]).tolist()
    n = lens.index(min(lens))
    return _zero_tokens(p, slice(int(p.cu_seqlens[n]), int(p.cu_seqlens[n + 1])))


@backend("fake.drop_last", **ANY)
def drop_last(p):
    """Zero output for the last token."""
    return _zero_tokens(p, -1)


@backend("fake.wrong_head", **ANY)
def wrong_head(p):
    """Value head 0 answers with value head 1's output."""

    def change(out):
        o = out.o.clone()
        o[:, :, 0] = out.o[:, :, 1]
        return Outputs(o, out.final_state, out.state_pool)

    return _wrapped(p, change)


@backend("fake.wrong_state", **ANY)
def wrong_state(p):
    """The last sequence's final state a tenth too large."""

    def change(out):
        state = out.final_state.clone()
        state[-1] *= 1.1
        return Outputs(out.o, state, out.state_pool)

    return _wrapped(p, change)


class Interrupt:
    """Raises KeyboardInterrupt from the second problem it is given (a user's Ctrl-C mid-run); with
    ``chained``, a RuntimeError raised while handling it, as a CUDA graph capture that a Ctrl-C broke
    does on its way out; with ``terminate``, sends its own process SIGTERM instead (``timeout``'s stop)."""

    calls = 0
    chained = False
    terminate = False


@backend("fake.interrupt", **ANY)
def interrupt(p):
    Interrupt.calls += 1
    if Interrupt.calls >= 2 and Interrupt.terminate:
        os.kill(os.getpid(), signal.SIGTERM)
    elif Interrupt.calls >= 2:
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt:
            if Interrupt.chained:
                raise RuntimeError("operation failed due to a previous error during capture") from None
            raise
    return ok.prepare(p)


@backend("fake.segfault", **ANY)
def segfault(p):
    import ctypes

    ctypes.string_at(0)  # reads address 0: SIGSEGV


@backend("fake.exits", **ANY)
def exits(p):
    print("fake.exits: leaving without a word", file=__import__("sys").stderr, flush=True)
    os._exit(3)


@backend("fake.native_hang", **ANY)
def native_hang(p):
    # a hang the Python-level limit cannot end, as one inside a library's C code: SIGALRM never gets through
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
    time.sleep(3600)


@triton.jit
def _store_far(ptr):
    tl.store(ptr + (1 << 40), 1.0)


@backend("fake.illegal_address", ops={"prefill", "decode"}, devices={"cuda"}, gating={"pre", "raw"})
def illegal_address(p):
    """A kernel that stores far past its buffer: a sticky CUDA error (an illegal memory access) that leaves the
    process's context unusable, as a kernel with a bad index does."""
    buf = torch.zeros(1, device=p.q.device)

    def call() -> None:
        _store_far[(1,)](buf)
        torch.cuda.synchronize()

    return Prepared(call, lambda: Outputs(o=torch.zeros_like(p.v)), None, "fake")

