"""Egress proxy for workers (mitmproxy addons): capture, fencing, mimicry, lease guard, replay.

Empty until the egress-proxy issue.
"""
