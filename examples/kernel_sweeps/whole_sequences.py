"""``triton.chunk_fused``'s chunk pipeline over whole sequences, as a backend to run beside the default.

The default plan sends tiny prefills to the recurrent kernel (docs/decisions/0024-tiny-prefill.md) and cuts few
long walks into warm-up segments (0018). This backend forces whole sequences (``segment_chunks=0``), which turns
both rules off, so one run times the chunk pipeline and the default side by side, e.g. the grid of 0024:

    gdnbench run tiny-grid.yaml -b triton.chunk_fused,triton.recurrent,\
examples.kernel_sweeps.whole_sequences:chunk_fused_whole_sequences
"""

from __future__ import annotations

from dataclasses import replace

from gdnbench.backends import Prepared, get_backend
from gdnbench.backends.triton_chunk import prepare_chunk
from gdnbench.problem import Problem


def _prepare_whole_sequences(p: Problem) -> Prepared:
    return prepare_chunk(p, fused=True, segment_chunks=0)


chunk_fused_whole_sequences = replace(get_backend("triton.chunk_fused"), name="sweep.chunk_fused_whole_sequences",
                                      prepare=_prepare_whole_sequences)
