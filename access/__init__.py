"""Who may do what, and under which names: the key ring and its credentials (`access.keys`), the roles and
their permissions (`access.permissions`), and the one tenancy rule (`access.tenancy`).

Below the queue core: it imports only the standard library, `protocol` and `wirelog`'s private-file helpers.
`access.tenancy` is pure (no I/O), so the core's sans-I/O machine may use it; the key file stays out of it.
This `__init__` imports nothing, so importing `access.tenancy` never loads the key file's module.
"""
