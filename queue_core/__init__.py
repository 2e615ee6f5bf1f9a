"""The strict queue: a sans-I/O state machine (`queue_core.machine`), its SQLite store and the server shell.

Messages carry a strict order parameter (a group, like an SQS MessageGroupId): same-group messages are
delivered one claim at a time, in order of receipt; every claim carries a fencing token.
"""
