"""gdnbench: a benchmarking harness for Gated DeltaNet (GDN) kernels."""

__version__ = "0.1.0"
