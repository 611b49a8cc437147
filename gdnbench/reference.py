"""Exact pure-PyTorch references for the gated delta rule (docs/design.md, "Conventions").

Two independent algorithms compute the same thing:

* ``gdn_recurrent``: the per-token recurrence, literally as docs/design.md writes it;
* ``gdn_chunk``: the chunked WY / UT-transform form that production kernels use.

Both run on any device (CPU or CUDA), are vectorised over sequences and value heads, and loop in
Python only over tokens (recurrent) or chunks (chunk). They are meant to be slow but trustworthy: every
input is upcast to ``compute_dtype`` (fp32 or fp64) before any arithmetic.

Conventions (canonical, docs/design.md "Conventions"):
    q, k  [B, T, H, K]      v [B, T, HV, V]      g, beta [B, T, HV]
    initial_state / final_state [N, HV, K, V] (K-first), N = B or the number of varlen sequences.
    Value head h reads q/k head h // (HV // H) (GVA).

Recurrence, per token t and value head (S is K x V):
    S = exp(g_t) * S ;  u = beta_t * (v_t - S^T k_t) ;  S = S + k_t u^T ;  o_t = S^T (scale * q_t)

Chunked form derivation (within one chunk, tokens i = 1..C, S0 the state entering the chunk,
gc_i = g_1 + ... + g_i the cumulative log decay inside the chunk). Unrolling the recurrence, the
state that token i sees right before its own write is
    S_i^- = exp(gc_i) S0 + sum_{j<i} exp(gc_i - gc_j) k_j u_j^T,
so its write u_i = beta_i (v_i - S_i^-^T k_i) satisfies, for all i at once,
    (I + A) Ucur = diag(beta) V - diag(beta) (exp(gc) o K) S0,
    A = strictLower(diag(beta) (Gamma o K K^T)),  Gamma_ij = exp(gc_i - gc_j).
With T = (I + A)^{-1} diag(beta), W = T (exp(gc) o K) and U = T V this is Ucur = U - W S0 ("v_new").
The outputs and the outgoing state then follow from the same unrolling:
    O    = (exp(gc) o Q) S0 + (lowerInclDiag(Gamma o Q K^T)) Ucur          (Q already scaled)
    S_C  = exp(gc_C) S0 + (exp(gc_C - gc) o K)^T Ucur
A, T, W, U and the masked Q K^T do not depend on S0, so they are built for all chunks at once; only
the last three lines need the sequential pass over chunks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["l2norm", "gdn_recurrent", "gdn_chunk", "gdn_decode", "gate_from_raw", "decay_from_raw", "VarlenLayout",
           "SlotLayout", "start_slots"]


def l2norm(x: Tensor, eps: float = 1e-6) -> Tensor:
    """L2-normalise the last dim, in x's own dtype (eps inside the rsqrt, as the kernels do)."""
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)


def gate_from_raw(a: Tensor, b: Tensor, A_log: Tensor, dt_bias: Tensor) -> tuple[Tensor, Tensor]:
    """Qwen3-Next raw gating: g = -exp(A_log) * softplus(a + dt_bias), beta = sigmoid(b), all in fp32.

    a, b: [B, T, HV]; A_log, dt_bias: [HV] (broadcast over the last dim). Returns (g, beta), both fp32.
    """
    return decay_from_raw(a, A_log, dt_bias), torch.sigmoid(b.float())


def decay_from_raw(a: Tensor, A_log: Tensor, dt_bias: Tensor) -> Tensor:
    """The log decay of raw gating, g = -exp(A_log) * softplus(a + dt_bias), in fp32."""
    # softplus with torch's default beta=1, threshold=20 (linear above 20), which is what the models use.
    return -torch.exp(A_log.float()) * F.softplus(a.float() + dt_bias.float())


# --------------------------------------------------------------------------------------------------
# Shared input handling: validation, upcast, GVA expansion and the varlen <-> padded-batch mapping.
# --------------------------------------------------------------------------------------------------


class VarlenLayout:
    """Where each packed token sits in the padded [N, Tmax] batch, validated once.

    Building it reads cu_seqlens on the host; passing a prebuilt layout as ``cu_seqlens`` keeps the
    solvers free of host syncs, so a timed call can be captured in a CUDA graph.
    """

    def __init__(self, N: int, T: int, Tmax: int, seq: Tensor, pos: Tensor) -> None:
        self.N, self.T, self.Tmax, self.seq, self.pos = N, T, Tmax, seq, pos

    @classmethod
    def build(cls, cu_seqlens: Tensor, T: int) -> VarlenLayout:
        cu = cu_seqlens.to(dtype=torch.long)
        if cu.dim() != 1 or cu.numel() < 2:
            raise ValueError("cu_seqlens must be 1-D with at least 2 entries")
        bounds = cu.tolist()
        lens = [b - a for a, b in zip(bounds, bounds[1:])]
        if bounds[0] != 0 or bounds[-1] != T or min(lens) < 0:
            raise ValueError(f"cu_seqlens must start at 0, be non-decreasing and end at T={T}, got {bounds}")
        N = len(lens)
        # Packed token p belongs to sequence seq[p] at position pos[p] inside it.
        seq = torch.repeat_interleave(torch.arange(N, device=cu.device), cu[1:] - cu[:-1], output_size=T)
        pos = torch.arange(T, device=cu.device) - cu[seq]
        return cls(N, T, max(lens), seq, pos)


def start_slots(slot_idx: Tensor, num_accepted_tokens: Tensor | None = None) -> Tensor:
    """The slot each decode sequence starts from: slot_idx [B], or, with per-token slots [B, T], the
    slot of its last accepted token, slot_idx[b, num_accepted_tokens[b] - 1]."""
    if num_accepted_tokens is None:
        return slot_idx
    return slot_idx.gather(1, num_accepted_tokens.to(torch.long)[:, None] - 1)[:, 0]


class SlotLayout:
    """Decode slots split into live rows and padding, validated once (host syncs happen here only).

    slot_idx [B]: sequence b reads and writes pool[slot_idx[b]]. slot_idx [B, T] with
    num_accepted_tokens [B] (speculative verify, vLLM's semantics): b starts from
    pool[slot_idx[b, num_accepted_tokens[b] - 1]] and the state after its token t goes to
    pool[slot_idx[b, t]]. A negative start slot makes b a padding sequence (zero output, no reads or
    writes); any other negative slot skips that one write.
    """

    def __init__(self, slot_idx: Tensor, pool_size: int, num_accepted_tokens: Tensor | None = None) -> None:
        slots = slot_idx.to(dtype=torch.long)
        if slots.dim() == 2:
            if num_accepted_tokens is None or num_accepted_tokens.shape != slots.shape[:1]:
                raise ValueError(f"slot_idx [B, T] = {tuple(slots.shape)} needs num_accepted_tokens [B]")
            accepted = num_accepted_tokens.to(dtype=torch.long, device=slots.device)
            if bool(((accepted < 1) | (accepted > slots.shape[1])).any()):
                raise ValueError(f"num_accepted_tokens must lie in 1..T={slots.shape[1]}")
            start, writes = start_slots(slots, accepted), slots
        elif slots.dim() == 1 and num_accepted_tokens is None:
            start, writes = slots, slots[:, None]
        else:
            raise ValueError(f"slot_idx must be [B] (or [B, T] with num_accepted_tokens), got {tuple(slots.shape)}")
        if bool((slots >= pool_size).any()):
            raise ValueError(f"slot_idx out of range for a pool of {pool_size} slots")
        self.pool_size = pool_size
        self.valid = start >= 0  # [B] bool
        self.gather = start.clamp(min=0)  # padding rows read slot 0 and are then zeroed
        live_writes = writes.masked_fill(~self.valid[:, None], -1)  # a padding sequence writes nothing
        written = live_writes[live_writes >= 0].tolist()
        if len(set(written)) != len(written):
            # Two writes to one slot has no well-defined result.
            raise ValueError("slot_idx repeats a non-negative slot")
        # per write position t: (batch rows that write, the slots they write)
        self.writes: list[tuple[Tensor, Tensor]] = []
        for col in live_writes.T:
            rows = (col >= 0).nonzero()[:, 0]
            self.writes.append((rows, col[rows]))


class _Prepared:
    """Inputs in the internal layout [N, HV, Tmax, D] (and [N, HV, Tmax] for g, beta), compute dtype.

    Varlen input is scattered into a zero-padded batch. A padded position has g = 0 and beta = 0, so it
    neither decays the state (exp(0) = 1) nor writes to it (u = 0): the state after the padding is the
    state after the last real token, which makes the padded batch exact rather than approximate.
    """

    def __init__(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        g: Tensor,
        beta: Tensor,
        scale: float | None,
        initial_state: Tensor | None,
        cu_seqlens: Tensor | VarlenLayout | None,
        qk_l2norm: bool,
        compute_dtype: torch.dtype,
    ) -> None:
        if compute_dtype not in (torch.float32, torch.float64):
            raise ValueError(f"compute_dtype must be float32 or float64, got {compute_dtype}")
        if q.dim() != 4 or k.shape != q.shape:
            raise ValueError(f"q and k must both be [B, T, H, K], got {tuple(q.shape)} and {tuple(k.shape)}")
        B, T, H, K = q.shape
        if v.dim() != 4 or v.shape[:2] != (B, T):
            raise ValueError(f"v must be [B, T, HV, V] with B={B}, T={T}, got {tuple(v.shape)}")
        HV, V = v.shape[2], v.shape[3]
        if HV % H != 0:
            raise ValueError(f"HV={HV} must be a multiple of H={H}")
        for name, t in (("g", g), ("beta", beta)):
            if t.shape != (B, T, HV):
                raise ValueError(f"{name} must be [B, T, HV] = {(B, T, HV)}, got {tuple(t.shape)}")

        cd = compute_dtype
        q, k, v, g, beta = (x.to(cd) for x in (q, k, v, g, beta))
        if qk_l2norm:
            # Normalise after the upcast so the reference does not inherit low-precision rounding.
            q, k = l2norm(q), l2norm(k)
        # Fold the scale into q once: o = S^T (scale * q).
        q = q * (K**-0.5 if scale is None else scale)
        if HV != H:
            # GVA: value head h uses q/k head h // (HV // H), i.e. each q/k head repeated consecutively.
            q = q.repeat_interleave(HV // H, dim=2)
            k = k.repeat_interleave(HV // H, dim=2)

        self.B, self.T, self.H, self.HV, self.K, self.V = B, T, H, HV, K, V
        self.dtype, self.device = cd, q.device
        self.cu_seqlens = cu_seqlens

        if cu_seqlens is None:
            N = B
            # [B, T, HV, D] -> [N, HV, T, D]
            self.q, self.k, self.v = (x.transpose(1, 2) for x in (q, k, v))
            self.g, self.beta = g.transpose(1, 2), beta.transpose(1, 2)
        else:
            if B != 1:
                raise ValueError(f"varlen (cu_seqlens) requires B == 1, got B={B}")
            lay = cu_seqlens if isinstance(cu_seqlens, VarlenLayout) else VarlenLayout.build(cu_seqlens, T)
            if lay.T != T:
                raise ValueError(f"the varlen layout covers {lay.T} tokens, the inputs have T={T}")
            N, Tmax, seq, pos = lay.N, lay.Tmax, lay.seq, lay.pos
            self._seq, self._pos = seq, pos

            def pad(x: Tensor) -> Tensor:  # [1, T, ...] -> [N, Tmax, ...], zeros elsewhere
                out = x.new_zeros((N, Tmax) + tuple(x.shape[2:]))
                out[seq, pos] = x[0]
                return out

            # Zero padding gives g = 0, beta = 0 (and k = q = v = 0) on the padded positions.
            self.q, self.k, self.v = (pad(x).transpose(1, 2) for x in (q, k, v))
            self.g, self.beta = pad(g).transpose(1, 2), pad(beta).transpose(1, 2)
        self.N = N

        if initial_state is None:
            self.S0 = torch.zeros(N, HV, K, V, dtype=cd, device=q.device)
        else:
            if initial_state.shape != (N, HV, K, V):
                raise ValueError(
                    f"initial_state must be [N, HV, K, V] = {(N, HV, K, V)} (K-first), got {tuple(initial_state.shape)}"
                )
            self.S0 = initial_state.to(device=q.device, dtype=cd)

    def unpad_output(self, o: Tensor) -> Tensor:
        """[N, HV, Tmax, V] -> canonical [B, T, HV, V]."""
        o = o.transpose(1, 2)  # [N, Tmax, HV, V]
        if self.cu_seqlens is None:
            return o.contiguous()
        return o[self._seq, self._pos].unsqueeze(0)


# --------------------------------------------------------------------------------------------------
# Recurrent reference
# --------------------------------------------------------------------------------------------------


def gdn_recurrent(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    beta: Tensor,
    *,
    scale: float | None = None,
    initial_state: Tensor | None = None,
    cu_seqlens: Tensor | VarlenLayout | None = None,
    qk_l2norm: bool = False,
    output_final_state: bool = True,
    compute_dtype: torch.dtype = torch.float32,
) -> tuple[Tensor, Tensor | None]:
    """The gated delta rule, one token at a time, exactly as docs/design.md ("Conventions") writes it.

    Returns (o [B, T, HV, V], final_state [N, HV, K, V] or None), both in compute_dtype.
    """
    p = _Prepared(q, k, v, g, beta, scale, initial_state, cu_seqlens, qk_l2norm, compute_dtype)
    S = p.S0.clone()  # [N, HV, K, V]
    o = p.q.new_zeros(p.N, p.HV, p.q.shape[2], p.V)
    decay = p.g.exp()  # [N, HV, T]
    for t in range(p.q.shape[2]):
        q_t, k_t, v_t = p.q[:, :, t], p.k[:, :, t], p.v[:, :, t]  # [N, HV, K|V]
        S = S * decay[:, :, t, None, None]
        # u = beta * (v - S^T k): the part of v the memory does not already predict for key k.
        pred = torch.einsum("nhk,nhkv->nhv", k_t, S)
        u = p.beta[:, :, t, None] * (v_t - pred)
        S = S + k_t[..., :, None] * u[..., None, :]
        o[:, :, t] = torch.einsum("nhk,nhkv->nhv", q_t, S)  # q already carries the scale
    return p.unpad_output(o), (S if output_final_state else None)


# --------------------------------------------------------------------------------------------------
# Chunked (WY / UT transform) reference
# --------------------------------------------------------------------------------------------------


@dataclass
class ChunkIntermediates:
    """Every quantity of the chunked algorithm, for checking a chunked kernel stage by stage.

    Token-indexed fields are in the canonical token layout [B, T, HV, ...] (varlen: B = 1), so they
    line up with a kernel's per-token buffers; chunks start at each sequence's first token.
    """

    gc: Tensor  # [B, T, HV] chunk-local cumulative log decay
    A_inv: Tensor  # [B, T, HV, C] each token's row of its chunk's (I + A)^-1
    A_inv_beta: Tensor  # [B, T, HV, C] the same of (I + A)^-1 diag(beta): v_new = it (V - exp(gc) o (K S))
    W: Tensor  # [B, T, HV, K] (I + A)^-1 diag(beta) (exp(gc) o K)
    U: Tensor  # [B, T, HV, V] (I + A)^-1 diag(beta) V
    v_new: Tensor  # [B, T, HV, V] U - W S: the writes each token actually makes
    h: Tensor  # [N, HV, NC, K, V] the state entering each chunk (NC: chunks of the longest sequence)
    o: Tensor  # [B, T, HV, V]
    final_state: Tensor  # [N, HV, K, V]


def chunk_intermediates(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    beta: Tensor,
    *,
    scale: float | None = None,
    initial_state: Tensor | None = None,
    cu_seqlens: Tensor | VarlenLayout | None = None,
    qk_l2norm: bool = False,
    compute_dtype: torch.dtype = torch.float32,
    chunk_size: int = 64,
    storage_dtype: torch.dtype | None = None,
) -> ChunkIntermediates:
    """The gated delta rule via the chunked UT-transform algorithm (derivation in the module docstring),
    keeping every intermediate. Arguments as gdn_recurrent's.

    ``storage_dtype`` (bf16, fp16 or fp32) rounds the intermediates where a chunked kernel at that input
    precision rounds them: (I + A)^-1, W, U, the operands of the products, the state entering each chunk as
    the output pass reads it, the writes v_new, and the output (fp32 truncates the products' operands to
    TF32, as tensor cores read them). Arithmetic stays in ``compute_dtype``. The result is not exact: it is what a
    correct kernel at that precision gets, the correctness gate's error floor (gdnbench.check).
    """
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    rnd = _rounding(storage_dtype)
    p = _Prepared(q, k, v, g, beta, scale, initial_state, cu_seqlens, qk_l2norm, compute_dtype)
    N, HV, K, V, C = p.N, p.HV, p.K, p.V, chunk_size
    Tp = p.q.shape[2]
    NC = -(-Tp // C)
    pad = NC * C - Tp
    # Pad the tail to whole chunks with g = 0, beta = 0, k = 0: such tokens leave the state untouched.
    Q, Kc, Vc = (F.pad(x, (0, 0, 0, pad)).view(N, HV, NC, C, x.shape[-1]) for x in (p.q, p.k, p.v))
    G, Bt = (F.pad(x, (0, pad)).view(N, HV, NC, C) for x in (p.g, p.beta))

    gc = G.cumsum(dim=-1)  # [N, HV, NC, C] cumulative log decay inside each chunk (<= 0)
    idx = torch.arange(C, device=p.device)
    incl = idx[:, None] >= idx[None, :]  # lower triangle incl. diagonal
    strict = idx[:, None] > idx[None, :]
    # Gamma_ij = exp(gc_i - gc_j) for i >= j. Mask to -inf *before* exp: above the diagonal the
    # difference is positive and exp would overflow to inf (inf * 0 = NaN) for strong decays.
    diff = gc[..., :, None] - gc[..., None, :]
    Gamma = torch.exp(diff.masked_fill(~incl, float("-inf")))  # [N, HV, NC, C, C], zero above diag

    # A = strictLower(diag(beta) (Gamma o K K^T)); I + A is unit lower triangular.
    A = (Gamma * (Kc @ Kc.transpose(-1, -2))).masked_fill(~strict, 0.0) * Bt[..., :, None]
    eye = torch.eye(C, dtype=A.dtype, device=p.device)
    A_inv = rnd(torch.linalg.solve_triangular(A + eye, eye.expand_as(A), upper=False, unitriangular=True))
    # T = (I + A)^{-1} diag(beta): diag(beta) is folded into the right-hand sides.
    eg = gc.exp()[..., None]  # [N, HV, NC, C, 1]
    W = rnd(A_inv @ rnd(Bt[..., None] * eg * Kc))
    U = rnd(A_inv @ rnd(Bt[..., None] * Vc))

    P = rnd(Gamma * (Q @ Kc.transpose(-1, -2)))  # decayed causal Q K^T, diagonal included (Gamma is 0 above)
    Qd = eg * Q  # reads the incoming state through the decay accumulated so far in the chunk
    Kd = rnd(torch.exp(gc[..., -1:] - gc)[..., None] * Kc)  # each write decayed to the end of the chunk
    g_last = gc[..., -1].exp()  # [N, HV, NC]

    S = p.S0.clone()
    o, v_new = Q.new_empty(N, HV, NC, C, V), Q.new_empty(N, HV, NC, C, V)
    h = Q.new_empty(N, HV, NC, K, V)
    for c in range(NC):
        h[:, :, c] = S
        S_read = rnd(S)  # the state is carried exactly; its products read it at the storage precision
        v_new[:, :, c] = rnd(U[:, :, c] - W[:, :, c] @ S_read)  # the actual writes u_i of this chunk
        o[:, :, c] = Qd[:, :, c] @ S_read + P[:, :, c] @ v_new[:, :, c]
        S = g_last[:, :, c, None, None] * S + Kd[:, :, c].transpose(-1, -2) @ v_new[:, :, c]

    def tokens(x: Tensor) -> Tensor:  # [N, HV, NC, C, D] -> canonical [B, T, HV, D]
        return p.unpad_output(x.reshape(N, HV, NC * C, x.shape[-1])[:, :, :Tp])

    return ChunkIntermediates(gc=tokens(gc[..., None])[..., 0], A_inv=tokens(A_inv),
                              A_inv_beta=tokens(A_inv * Bt[..., None, :]), W=tokens(W), U=tokens(U),
                              v_new=tokens(v_new), h=h, o=rnd(tokens(o)), final_state=S)


def truncate_to_tf32(x: Tensor) -> Tensor:
    """fp32 values as a tensor core reads them for one TF32 product: the 13 low mantissa bits dropped (toward
    zero), kept in fp32. Triton hands fp32 registers to the MMA without rounding them first (its "tf32"
    precision, FLA's), and the truncation's bias accumulates in the state (docs/decisions/0023-fp32-dots.md)."""
    bits = x.float().contiguous().view(torch.int32)
    truncated = bits & ~((1 << 13) - 1)
    return torch.where(torch.isfinite(x), truncated.view(torch.float32), x.float()).to(x.dtype)


def _rounding(storage_dtype: torch.dtype | None) -> Callable[[Tensor], Tensor]:
    """x -> x rounded to ``storage_dtype`` and back (TF32 by truncation for fp32); the identity for None."""
    if storage_dtype is None:
        return lambda x: x
    if storage_dtype == torch.float32:
        return truncate_to_tf32
    if storage_dtype not in (torch.bfloat16, torch.float16):
        raise ValueError(f"storage_dtype must be bf16, fp16 or fp32, got {storage_dtype}")
    return lambda x: x.to(storage_dtype).to(x.dtype)


def gdn_chunk(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    beta: Tensor,
    *,
    scale: float | None = None,
    initial_state: Tensor | None = None,
    cu_seqlens: Tensor | VarlenLayout | None = None,
    qk_l2norm: bool = False,
    output_final_state: bool = True,
    compute_dtype: torch.dtype = torch.float32,
    chunk_size: int = 64,
) -> tuple[Tensor, Tensor | None]:
    """The gated delta rule via the chunked UT-transform algorithm (derivation in the module docstring).

    Same contract as gdn_recurrent; an independent second implementation to cross-check it.
    """
    r = chunk_intermediates(q, k, v, g, beta, scale=scale, initial_state=initial_state, cu_seqlens=cu_seqlens,
                            qk_l2norm=qk_l2norm, compute_dtype=compute_dtype, chunk_size=chunk_size)
    return r.o, (r.final_state if output_final_state else None)


# --------------------------------------------------------------------------------------------------
# Decode on a state pool
# --------------------------------------------------------------------------------------------------


def gdn_decode(
    solve: Callable[..., tuple[Tensor, Tensor | None]],
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    beta: Tensor,
    *,
    state_pool: Tensor,
    slot_idx: Tensor | SlotLayout,
    num_accepted_tokens: Tensor | None = None,
    scale: float | None = None,
    qk_l2norm: bool = False,
    compute_dtype: torch.dtype = torch.float32,
    **kw,
) -> Tensor:
    """Decode (T >= 1 tokens per sequence) against a state pool, updating the pool in place.

    state_pool [S, HV, K, V] (fp32 or bf16), slot_idx [B] (int32; negative = padding sequence), or
    [B, T] with num_accepted_tokens [B] (speculative verify, see SlotLayout), or a prebuilt SlotLayout of
    them (no host syncs then). Sequence b starts from its start slot (upcast) and runs ``solve``
    (gdn_recurrent or gdn_chunk; extra keyword arguments go to it), over all T tokens at once when it
    writes one state, token by token when it writes one per token; each state written is cast to the
    pool's dtype first. Padding sequences get zero output and touch no slot; every other slot is left
    bit-identical. Returns o [B, T, HV, V] in compute_dtype.
    """
    B, T = q.shape[:2]
    if state_pool.dim() != 4:
        raise ValueError(f"state_pool must be [S, HV, K, V], got {tuple(state_pool.shape)}")
    lay = (slot_idx if isinstance(slot_idx, SlotLayout)
           else SlotLayout(slot_idx, state_pool.shape[0], num_accepted_tokens))
    if lay.valid.shape != (B,) or lay.pool_size != state_pool.shape[0] or T % len(lay.writes):
        raise ValueError(f"slot_idx must be [B] = [{B}] (or [B, T] = [{B}, {T}]) for a pool of "
                         f"{state_pool.shape[0]} slots")

    # Padding rows start from zeros rather than from whatever slot a clamp would point at; the negative
    # index itself must never reach the pool (-1 would silently mean the last slot).
    valid = lay.valid[:, None, None, None]
    state = state_pool[lay.gather].to(compute_dtype)
    state = torch.where(valid, state, torch.zeros_like(state))
    step = T // len(lay.writes)  # tokens between two state writes: T, or 1 with per-token slots
    outs = []
    for i, (rows, slots) in enumerate(lay.writes):
        span = slice(i * step, (i + 1) * step)
        o, state = solve(
            q[:, span], k[:, span], v[:, span], g[:, span], beta[:, span],
            scale=scale, initial_state=state, qk_l2norm=qk_l2norm,
            output_final_state=True, compute_dtype=compute_dtype, **kw,
        )
        assert state is not None
        outs.append(o)
        state_pool[slots] = state[rows].to(state_pool.dtype)
    o = torch.cat(outs, dim=1)
    return torch.where(valid, o, torch.zeros_like(o))
