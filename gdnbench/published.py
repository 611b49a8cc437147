"""The published comparison that ``suites/parity.yaml`` reproduces (docs/design.md, "The published comparison").

A public write-up of SM90 CUDA GDN kernels (github kingsleykimm/h100_gdn_cuda, the ``gdn_cuda.*`` backends)
timed them against FLA's ``chunk_gated_delta_rule`` on 27 bf16 prefill cases and reported, per case, FLA's
median over its kernel's (above 1 its kernel is faster). These are those figures, keyed by the suite's case
fields; ``docs/status.md`` sets them beside the ratios measured here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

SUITE = "parity"

# (B, T, H, D, gate_norm, mask_p) -> FLA / the write-up's kernel
PADDED: dict[tuple[int, int, int, int, float, float], float] = {
    (1, 63, 1, 64, 1, 0): 3.22, (2, 500, 3, 60, 1, 0): 2.35, (2, 1000, 3, 64, 1, 0.5): 2.44,
    (3, 1024, 4, 100, 0.1, 0): 1.09, (4, 1024, 4, 128, 1, 0): 1.23, (2, 1500, 4, 128, 10, 0): 1.18,
    (4, 2048, 8, 64, 1, 0): 0.45, (8, 512, 8, 64, 1, 0): 0.86, (16, 512, 8, 64, 1, 0): 0.48,
    (32, 256, 8, 64, 1, 0): 0.48, (64, 128, 8, 64, 1, 0): 0.47, (8, 512, 8, 128, 1, 0): 0.80,
    (16, 256, 8, 128, 1, 0): 0.80, (32, 128, 8, 128, 1, 0): 0.77, (64, 64, 8, 128, 1, 0): 0.76,
}

# (sequences, total tokens, H, D, mask_p), gate_norm 1 -> FLA / the write-up's kernel
VARLEN: dict[tuple[int, int, int, int, float], float] = {
    (1, 15, 4, 60, 0): 2.68, (3, 1000, 4, 64, 0): 2.72, (3, 1000, 4, 64, 0.5): 2.71, (5, 2000, 4, 100, 0): 1.16,
    (1, 8192, 4, 60, 0): 0.52, (8, 4096, 4, 64, 0): 1.62, (16, 8192, 4, 64, 0): 0.87, (32, 8192, 4, 64, 0): 0.87,
    (64, 8192, 4, 64, 0): 0.88, (32, 4096, 4, 128, 0): 1.33, (64, 6656, 4, 128, 0): 0.76,
    (128, 4608, 4, 64, 0.5): 0.90,
}


def published_speedup(fields: Mapping[str, Any]) -> float | None:
    """The published FLA / write-up ratio of the parity case with these fields (a results row or a case's
    fields: mode, B, T, H, K, gate_norm, mask_p; varlen: num_seqs, total_tokens), or None for another case."""
    def num(name: str) -> float:
        value = fields.get(name)
        return math.nan if value is None else float(value)

    if fields.get("mode") == "varlen":
        if any(math.isnan(num(n)) for n in ("num_seqs", "total_tokens", "H", "K")):
            return None
        return VARLEN.get((int(num("num_seqs")), int(num("total_tokens")), int(num("H")), int(num("K")),
                           num("mask_p")))
    if any(math.isnan(num(n)) for n in ("B", "T", "H", "K")):
        return None
    return PADDED.get((int(num("B")), int(num("T")), int(num("H")), int(num("K")), num("gate_norm"),
                       num("mask_p")))
