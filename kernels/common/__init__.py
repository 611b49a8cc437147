"""What every bundled kernel shares: input checks, the interpreter flag, Triton device math and the tuner."""
