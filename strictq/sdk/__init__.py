"""The strictq worker SDK: an asyncio `Worker` and a batching `Producer`, configured from the STRICTQ_*
environment variables, talking to the gateway's EmoDB face.

- `Worker(queue, handler, probe=None)`: long-lived consumer; `raise SystemExit(run(worker))` runs it
  until SIGTERM (exit 0) or Ctrl-C (exit 130), handing back what it holds and has not finished; or
  `await worker.run()` until `worker.stop()` (or a signal after `install_signal_handlers()`). Every poll
  declares `X-Strictq-Capabilities: results, probes` (it takes part in failure management).
  The handler gets a `Message` (id, group, seq, token, attempt, payload, `http`: the tagged outbound
  session; `history`: what earlier attempts did; `probe`) and records this attempt's log data on it
  (`await message.step(name, result)`, `message.partial`, `message.fields`); the worker reports each
  attempt's outcome (succeeded / failed / partial / not_attempted) to the gateway.
  `AttemptFailed(reason)`: fail an attempt with your own reason.
- `Producer()`: `send_batch([Entry(queue, payload, group)])` → one `SendResult` per entry; `send()` buffers.
- `ClientConfig.from_env()`: the configuration; `CallFenced`: raised by a tagged call the proxy refused.
- `PollItem`: one polled message as `EmoClient.poll` returns it (built from the wire JSON in one place;
  `MalformedPollItem` names the field otherwise).
- `SetupError`: settings that cannot work, one message naming the setting, never retried: `ConfigError`
  (a STRICTQ_* variable missing or invalid, a CA file that is not there), `AuthRefused` (the gateway
  does not take the key: 401/403), `TLSFailed` (its certificate cannot be verified with STRICTQ_CA_FILE).
  `strictq.sdk.run` reports them as one line and exits 1 (2 for `ConfigError`).
- `Retry` (strictq.sdk.retry): the one decision of what is retried (no answer, 5xx, 429, a retriable
  body) and how long to wait (full jitter, strictq.sdk.backoff).
"""

from .attempt import AttemptFailed, History
from .client import CAPABILITIES_HEADER, EmoClient
from .config import ClientConfig
from .errors import (
    AuthRefused,
    ConfigError,
    GatewayError,
    LeaseRefused,
    MalformedPollItem,
    ResultsUnsupported,
    SetupError,
    TLSFailed,
)
from .item import PollItem
from .outbound import TAG_HEADERS, CallFenced
from .producer import Entry, Producer, SendResult
from .retry import Retry
from .worker import Context, Handler, Message, Worker, WorkerError, WorkerStats, run, serve

__all__ = [
    "CAPABILITIES_HEADER",
    "TAG_HEADERS",
    "AttemptFailed",
    "AuthRefused",
    "CallFenced",
    "ClientConfig",
    "ConfigError",
    "Context",
    "EmoClient",
    "Entry",
    "GatewayError",
    "Handler",
    "History",
    "LeaseRefused",
    "MalformedPollItem",
    "Message",
    "PollItem",
    "Producer",
    "ResultsUnsupported",
    "Retry",
    "SendResult",
    "SetupError",
    "TLSFailed",
    "Worker",
    "WorkerError",
    "WorkerStats",
    "run",
    "serve",
]
