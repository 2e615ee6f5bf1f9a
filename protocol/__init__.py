"""The wire vocabulary every layer shares: header names, outcome and status names, error codes.

Dependency-free (standard library only), so the queue core's sans-I/O machine, the access rules, the gateway,
the egress proxy and the SDK can all name the same header or code without importing one another.
"""
