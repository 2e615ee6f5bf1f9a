"""The strictq worker SDK: an asyncio `Worker` and a batching `Producer`, configured from the STRICTQ_*
environment variables, talking to the gateway's EmoDB face.

- `Worker(queue, handler)`: long-lived consumer; `await worker.run()` until `worker.stop()` (or SIGTERM
  after `install_signal_handlers()`). The handler gets a `Message` (id, group, seq, token, attempt,
  payload, `http`: the tagged outbound session).
- `Producer()`: `send_batch([Entry(queue, payload, group)])` → one `SendResult` per entry; `send()` buffers.
- `ClientConfig.from_env()`: the configuration; `CallFenced`: raised by a tagged call the proxy refused.
"""

from .client import EmoClient, GatewayError, LeaseRefused
from .config import ClientConfig, ConfigError
from .outbound import TAG_HEADERS, CallFenced
from .producer import Entry, Producer, SendResult
from .worker import Context, Handler, Message, Worker, WorkerError, WorkerStats

__all__ = [
    "TAG_HEADERS",
    "CallFenced",
    "ClientConfig",
    "ConfigError",
    "Context",
    "EmoClient",
    "Entry",
    "GatewayError",
    "Handler",
    "LeaseRefused",
    "Message",
    "Producer",
    "SendResult",
    "Worker",
    "WorkerError",
    "WorkerStats",
]
