"""The fused recurrent gated delta rule (decode and short prefill): ``kernel`` and its launcher ``forward``."""

from .forward import (CONFIGS, INTERPRETED, best_config, config_str, key_runs, recurrent_gdn, tune_key,
                      tuning_candidates)

__all__ = ["recurrent_gdn", "tune_key", "key_runs", "tuning_candidates", "best_config", "config_str", "CONFIGS",
           "INTERPRETED"]
