"""Gluon kernels of the fused chunked pipeline for Hopper (sm_90): the prep kernel (``prep``), two walks with
the output fused in (``walk``, ``walk_transposed``) and the prep and walk in one warp-specialized kernel
(``specialized``). Each module says which calls it serves (``unsupported``) and what it ran (``describe``).
"""

from . import walk, walk_transposed

__all__ = ["GLUON_WALKS", "SPECIALIZED"]

# The Gluon walks by name (a call's ``walk``), each a module with fused_walk, unsupported and describe
GLUON_WALKS = {"sm90": walk, "sm90_transposed": walk_transposed}
# walk=SPECIALIZED: the prep and the walk in one warp-specialized kernel (``specialized``)
SPECIALIZED = "sm90_specialized"
