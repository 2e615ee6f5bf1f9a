"""The run's internal secret (tests/conftest.py writes it and exports STRICTQ_INTERNAL_SECRET_FILE) for
clients a test builds in its own process: a RemoteQueueService, a ClusterBackend, raw aiohttp sessions."""

from __future__ import annotations

import os

from queue_core.internal_auth import ENV, InternalSecret


def internal_secret() -> InternalSecret:
    """The secret every queue server and cluster node of this run was started with."""
    return InternalSecret.load(os.environ[ENV])


def internal_headers() -> dict[str, str]:
    """`X-Strictq-Internal` with the run's secret, for a raw aiohttp request to a queue server."""
    return internal_secret().headers
