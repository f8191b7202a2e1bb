"""Benchmark suite: vLLM without speculation vs in-tree draft_model / ngram vs the plugin.

Entry point ``python -m benchmarks.run``; see benchmarks/README.md. ``analytic`` and
``stats`` are pure Python (no vLLM import) and unit-tested.
"""
