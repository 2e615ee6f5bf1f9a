"""Edge gateway: TLS, API keys, the SQS JSON and EmoDB REST faces, geographic routing to queue servers.

Empty until the gateway issue; the queue server's internal API is what it will forward to.
"""
