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
"""

from .attempt import AttemptFailed, History
from .client import CAPABILITIES_HEADER, EmoClient, GatewayError, LeaseRefused, ResultsUnsupported
from .config import ClientConfig, ConfigError
from .outbound import TAG_HEADERS, CallFenced
from .producer import Entry, Producer, SendResult
from .worker import Context, Handler, Message, Worker, WorkerError, WorkerStats, run, serve

__all__ = [
    "CAPABILITIES_HEADER",
    "TAG_HEADERS",
    "AttemptFailed",
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
    "Message",
    "Producer",
    "ResultsUnsupported",
    "SendResult",
    "Worker",
    "WorkerError",
    "WorkerStats",
    "run",
    "serve",
]
