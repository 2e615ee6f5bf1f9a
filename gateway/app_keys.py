"""The edge app's keys and body limit, in a module of their own: the faces (gateway.sqs, gateway.emodb) and
the app that mounts them (gateway.app) all read them, and none has to import another back."""

from __future__ import annotations

from aiohttp import web

from access.keys import KeyRing
from queue_core.backend import QueueBackend

from .backpressure import BackpressureGate
from .rate_limits import TenantRateLimiter
from .routing import PartitionRouter

# Bodies above this are refused while being read (aiohttp stops at client_max_size), before they are
# read whole; each face answers in its own dialect (413 on EmoDB, an SQS error on the SQS face).
MAX_EDGE_BODY = 4 * 1024 * 1024

SERVICE = web.AppKey("service", QueueBackend)
KEYS = web.AppKey("keys", KeyRing)
ROUTER = web.AppKey("router", PartitionRouter)
LIMITER = web.AppKey("limiter", TenantRateLimiter)  # per-tenant send rates (gateway.rate_limits)
BACKPRESSURE = web.AppKey("backpressure", BackpressureGate)  # queues slowing producers (gateway.backpressure)
