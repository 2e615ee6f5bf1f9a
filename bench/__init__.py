"""strictq benchmark suite: `python -m bench.run` (see docs/benchmarks.md, which each run regenerates)."""
