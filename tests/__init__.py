# Tests that run a subprocess (the Triton interpreter, the sweeps' CLIs) wait this long before failing it as
# hung. A guard against a hang, not against a slow machine: CI's limit is 90 minutes, and CPU machines have
# run the interpreted tests up to 6x slower than the one they were written on.
SUBPROCESS_TIMEOUT_S = 1800
