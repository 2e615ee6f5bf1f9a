"""Scenarios: whole-system stories run against the product, above it in the layers.

The failover scenario (`scenarios.failover`: `strictq serve`, a fake payments backend, a producer, SDK
workers, one turning faulty, a backend outage) is what `strictq demo` narrates (`scenarios.demo`), what
`tests/test_failure_e2e.py` asserts and what `bench/failure_bench.py` times. `scenarios.topn` is multi-tier
processing: the top-N hashtags example over strict queues, checked against Spark (docs/multi-tier.md).
Nothing in `strictq` or below imports this package (import-linter's layers contract): `strictq demo`
reaches the CLI through the `strictq.commands` entry-point group declared in pyproject.toml.
"""
