"""Replay-based software testing: run a new worker version against recorded traffic and diff it.

`strictq replay` (fencing.replay.cli) selects recorded message attempts from the wire log (`stories`),
runs the candidate worker (and optionally a baseline) in an isolated embedded queue with the egress
proxy in replay mode, so every outbound call is answered from the recording and none leaves the
machine (`matching`; a run's contract is `run`, the stack it runs on strictq.replay_stack's), compares
per message (`compare`, with `masking` for non-deterministic fields) and writes a terminal summary,
JSON and HTML (`report`, `terminal`, `html`). `canary` is the documented hook for a later live canary
rollout. See docs/replay.md.

Modules import lazily: `strictq --help` must not load aiohttp, mitmproxy or rich.
"""
