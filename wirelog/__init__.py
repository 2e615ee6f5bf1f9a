"""Wire-log records (schema v1 of shared/design.md): format, rotating writer with redaction, reader.

Empty until the egress-proxy issue.
"""
