"""The chunked gated delta rule (prefill): two pipelines over one set of stage kernels.

The algorithm is the one derived in ``gdnbench.reference`` (module docstring): chunks of C = 64 tokens,
chunk-local cumulative log decay gc, A = strictLower(diag(beta)(Gamma o K K^T)), (I + A)^-1,
W = (I + A)^-1 diag(beta) (exp(gc) o K), U = (I + A)^-1 diag(beta) V, then a sequential pass over chunks
for the state (v_new = U - W S, S <- exp(gc_C) S + (exp(gc_C - gc) o K)^T v_new) and a parallel pass for
the outputs (O = exp(gc) o (Q S) + lowerIncl(Gamma o Q K^T) v_new, scaled). One module per stage:

  ``gate``    (a) gc = cumsum(g) per (chunk, value head); raw gating's g and beta first;
  ``prep``    (b) A (one 64 x 64 tensor-core dot over the key tile) and (I + A)^-1;
  ``wu``      (c) W and U;
  ``state``   (d) per (sequence, value head, V-block): the walk over the sequence's chunks, the [K, BV]
              state slice in registers (fp32), storing the chunk-entry states h and v_new, or computing
              the outputs itself (``FUSE_OUTPUT``), over whole sequences or warm-up segments;
  ``output``  (e) per (block of chunks, value head, V-block): the outputs from q, k, gc, h and v_new.

``forward.chunk_gdn`` runs one kernel per stage, every intermediate through global memory (FLA's pipeline,
which it is measured against). ``forward.chunk_fused_gdn`` runs (a) and (b) in one kernel that stores
Ai = (I + A)^-1 diag(beta), takes each chunk's writes in the walk as v_new = Ai (V - exp(gc) o (K S)) (W and
U never stored), and executes a ``plan.ChunkPlan``: made once on the host from the problem's layout, it says
whether the output folds into the walk, whether the walks are cut into warm-up segments, whether the stages
are pipelined (``pipeline``) and which kernels run, the Gluon kernels for Hopper (``sm90``) among them, or,
for sequences of a few tokens, the recurrent kernel (``plan.RECURRENT``) instead of chunks.

Layout (``layout``): every token-indexed buffer is flat over tokens ([B * T, heads, dim]) and every kernel
finds its sequence through ``seq_bounds``, so padded and varlen batches are one code path. Chunks never
straddle sequences; rows past a sequence's end have g = beta = 0, so they neither decay nor write. GVA:
value head h reads q/k head h // (HV // H). Head dims are padded to a power of two >= 16 (tl.dot's minimum)
and masked, so 60 and 100 run in 64 and 128 tiles. The key dim is one tile (K <= 256) because the in-kernel
q/k L2 norm needs whole rows.

Tuning is limited to the prep, state and output kernels, keyed on (K, V), a size tier (``layout.state_tier``,
``layout.chunk_tier``) and the arguments' dtypes, a few candidates each timed side by side in CUDA graphs
(``common.tuning.TunedKernel``; docs/decisions/0019-chunk-kernel-configs.md). Under the Triton interpreter
there is one config per kernel and no tuning (``common.device`` covers where the interpreter differs).
"""

from ..common.interpreter import runs_interpreted
from .forward import chunk_fused_gdn, chunk_gdn, describe
from .gate import chunk_gate_kernel
from .layout import CHUNK, ChunkLayout, ChunkWorkspace, PipelineLayout, SegmentLayout, WalkOrder
from .plan import ChunkPlan, default_plan

__all__ = ["chunk_gdn", "chunk_fused_gdn", "describe", "ChunkPlan", "default_plan", "ChunkLayout", "ChunkWorkspace",
           "SegmentLayout", "WalkOrder", "PipelineLayout", "CHUNK", "INTERPRETED"]

# Triton compiles or interprets a kernel as it is decorated: what the stage kernels got
INTERPRETED: bool = runs_interpreted(chunk_gate_kernel)
