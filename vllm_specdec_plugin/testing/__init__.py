"""Helpers for tests and benchmarks that drive a real vLLM engine in a subprocess."""
