"""`--lengths DATA`: per-step, per-rank peaks from the training data's token lengths and the loader's batching."""
