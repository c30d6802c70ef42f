"""Benchmarks: ``python -m mini_of3.bench kernels`` (more sub-commands as their issues land)."""
