"""Roofline models (docs/design.md, "Roofline"): bytes moved and FLOPs per case, for GB/s and TFLOP/s columns."""

from __future__ import annotations

from gdnbench.suite import Case

BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}
CHUNK = 64


def traffic(case: Case) -> tuple[float, float]:
    """(bytes, flops) a kernel must at least move and compute for ``case``.

    Inputs and outputs are counted once each; states are read and written once. FLOPs count the
    chunked algorithm for prefill (per token and value head: 6CK + 4CV + 6KV) and the recurrence
    for decode (per token and value head: 6KV: decay, delta, rank-1 update and read-out).
    """
    n_tok, H, HV, K, V = case.tokens, case.H, case.HV, case.K, case.V
    x = BYTES[case.dtype]
    io = n_tok * (2 * H * K * x + 2 * HV * V * x + HV * 4 + HV * x)  # q, k, v, o, g (fp32), beta
    if case.gating == "raw":
        io += n_tok * HV * x  # a and b instead of g (fp32) and beta: one more input-dtype tensor
        io -= n_tok * HV * 4
    state = case.N * HV * K * V
    if case.op == "decode":
        # pool: one slot read, one written per state write (one per token with per_token_slots); slot_idx
        io += (1 + case.state_writes) * state * BYTES[case.state_dtype] + case.N * case.state_writes * 4
        flops = n_tok * HV * 6 * K * V
    else:
        io += state * 4 * ((case.initial_state != "none") + case.output_final_state)
        flops = n_tok * HV * (6 * CHUNK * K + 4 * CHUNK * V + 6 * K * V)
    return float(io), float(flops)
