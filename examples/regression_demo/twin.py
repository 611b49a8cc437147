"""``triton.chunk_fused`` under a second name, for an A/A run: the same kernel timed against itself.

Interleaved with the original (two backends and a baseline turn interleaving on), every speedup's true
value is 1, so the run shows how wide the intervals are when nothing differs, and that the paired one (the
median of the rounds' ratios, docs/decisions/0025-paired-intervals.md) is the narrower:

    gdnbench run qwen3-next -k B=4,T=8192 \
        -b triton.chunk_fused,examples.regression_demo.twin:twin_chunk_fused --baseline triton.chunk_fused
"""

from __future__ import annotations

from dataclasses import replace

from gdnbench.backends import get_backend

twin_chunk_fused = replace(get_backend("triton.chunk_fused"), name="twin.chunk_fused")
