"""Multi-tier processing (issue 18, docs/multi-tier.md): the top N hashtags of a generated stream of posts,
computed by SDK workers over strict queues in four tiers (map -> summarise -> aggregate -> final, fewer
queues and workers at each), and checked against the same top N computed by a Spark job over the raw
stream (spark/topn.py).

- posts.py: the seeded stream (Zipf-like tag popularity) and the one hashtag definition;
- tiers.py: the topology (queues and groups per tier) and each tier's pure step;
- state.py: per-group local state (`GroupStates`: export / import_) and fenced checkpoints;
- workers.py: a tier's worker on the SDK; run.py: the run against a `strictq serve`;
- __main__.py: `python -m scenarios.topn --posts 20000 --top 10`.
"""
