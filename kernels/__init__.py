"""gdnbench's bundled Triton kernels, imported as ``gdnbench_kernels``.

The folder is ``kernels/`` but the import name is ``gdnbench_kernels`` (see pyproject.toml), because
PyPI's ``kernels`` package (used by transformers for hub kernels) already owns ``kernels``. The harness
reaches these kernels only through backends registered in the ``gdnbench.backends`` entry-point group,
exactly as it reaches third-party libraries.
"""
