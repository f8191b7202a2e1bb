"""The draft model on vLLM's kernels: one round of passes (round.py), draft sampling
(sampler.py), start-up checks of a draft/target pair (checks.py)."""
