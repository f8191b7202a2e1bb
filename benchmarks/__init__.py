"""The serving benchmark: ``python -m benchmarks.serving`` (benchmarks/README.md), and
``python -m benchmarks.step_log`` over its servers' step logs."""
