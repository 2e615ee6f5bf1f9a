"""HTTP header names of strictq's APIs: one spelling, imported by every side that reads or writes them.

aiohttp's and mitmproxy's header maps are case-insensitive, so these canonical spellings also match the
lowercase forms on the wire; `lower()` gives the byte form mitmproxy's raw header lists use.
"""

API_KEY = "X-BV-API-Key"  # the credential's secret (EmoDB's header; admin and internal API too)

# The EmoDB face's strict-queue extensions.
GROUP = "X-Strictq-Group"  # the strict order group of a send
LEASE = "X-Strictq-Lease"  # a claim's fencing token (ack, renew; a tagged outbound call)
CAPABILITIES = "X-Strictq-Capabilities"  # what a worker's poll takes part in (`results, probes`)
# The software version a worker runs (the SDK's `Worker(version=...)`), on its polls: group routing gives a
# rollout's canary share of groups only to workers of the canary version (docs/rollouts.md).
WORKER_VERSION = "X-Strictq-Worker-Version"
# The largest message body a worker takes (the SDK's `Worker(max_message_bytes=...)`), on its polls: groups
# whose next message is bigger go to a worker that can take it, when one is polling (docs/rollouts.md).
WORKER_MAX_BYTES = "X-Strictq-Worker-Max-Bytes"
# On a poll answer to a worker declaring the `state` capability: the groups whose local state it should
# upload now (state transfer, docs/state-transfer.md), each percent-encoded, comma-separated.
HANDOVER = "X-Strictq-Handover"
# A producer's estimate of its messages' processing and pre-processing seconds, on a send (pipelining:
# `processing=0.03, preprocessing=0.02`; queue_core.machine.estimates).
ESTIMATE = "X-Strictq-Estimate"

# The worker's tags on outbound calls (the SDK adds them, the egress proxy reads and strips them).
QUEUE = "X-Strictq-Queue"  # the poll item's `queue_ref`
MESSAGE_ID = "X-Strictq-Message-Id"
ATTEMPT = "X-Strictq-Attempt"
CALL = "X-Strictq-Call"  # the ordinal of the call within the attempt, 1, 2, ...
TAG_PREFIX = "X-Strictq-"
TAGS = (QUEUE, MESSAGE_ID, GROUP, LEASE, ATTEMPT, CALL)
# An optional tag, sent when the delivery carried it: the id of the request that sent the message
# (protocol.request_ids), which the egress proxy writes into the call's wire-log record as `request_id`.
REQUEST_ID_TAG = "X-Strictq-Request-Id"

# Request ids (protocol.request_ids): a client may name its request; every gateway answer names it. The
# SQS face names it as AWS does, `x-amzn-RequestId` (and echoes X-Request-Id only to a client that sent one).
REQUEST_ID = "X-Request-Id"
AMZN_REQUEST_ID = "x-amzn-RequestId"

PROXY_ACTION = "X-Strictq-Proxy-Action"  # on a response the egress proxy made itself

# The internal API of a cluster node: the partition a request is for (a node serves several at once; one
# that does not serve it now answers 421 `not_owner`). A single-process queue server ignores it.
PARTITION = "X-Strictq-Partition"
# The internal API's credential (queue_core.internal_auth): the deployment's shared secret, sent by the
# gateways, the CLI and tools that call a queue server's internal port; every route but /healthz and
# /readyz refuses a request without it (401) or with another (403).
INTERNAL_SECRET = "X-Strictq-Internal"

# Geography (issue 16): the region a client says it runs in (the SDK sends STRICTQ_REGION). An edge started
# with --trust-region-header takes it as the client's region; otherwise it only orders that worker's own
# polling (partitions owned in its region first) and never counts toward placement.
REGION = "X-Strictq-Region"
