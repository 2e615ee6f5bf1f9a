"""Node, region and zone names: they are KV keys and show in logs, so a small safe alphabet."""

from __future__ import annotations

import re

NODE_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")


def check_node_name(name: str, what: str = "node name") -> str:
    """What is wrong with `name` as a node name (or another `what` of the same alphabet), or "" when
    nothing is."""
    if not NODE_NAME.fullmatch(name):
        return f"{name!r} is not a {what}: 1-64 letters, digits, '_' or '-'"
    return ""
