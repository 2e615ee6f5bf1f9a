"""The SDK's errors, in one module so the client, the poll item, the retry helper and the configuration can
all name them without importing one another.

Two families:
- `GatewayError` (the gateway refused a call or could not be reached): `LeaseRefused` (409 on a fenced
  ack or renew), `ResultsUnsupported` (an older gateway without the results route), `MalformedPollItem`
  (a poll answer the SDK cannot read). Like the server's error model (protocol.errors), each error says
  whether it is worth retrying (`transient`, `unsent`); `strictq.sdk.retry` is the one loop that acts on
  it.
- `SetupError` (the client's own settings are wrong; retrying cannot help, the message names the
  setting): `ConfigError` (a STRICTQ_* variable missing or invalid, a CA file that is not there),
  `AuthRefused` (the gateway does not take the key: 401/403) and `TLSFailed` (the gateway's certificate
  cannot be verified, or the URL's scheme does not match the server). `AuthRefused` and `TLSFailed` are
  also `GatewayError`s, so code that catches those keeps working.
"""

from __future__ import annotations

from typing import Any

from protocol.errors import parse_error

RETRY_STATUSES = frozenset({429})  # too many requests: not applied, try later (beside 5xx and no answer)


class SetupError(Exception):
    """The client's settings are wrong: retrying cannot help. The message names the setting to fix."""


class ConfigError(SetupError, ValueError):
    """The configuration lacks something the caller needs; the message names the variable."""


class GatewayError(Exception):
    """The gateway refused a call or could not be reached (status 0). `sent` is False when the request
    never left (the connection was refused): a retry cannot make it happen twice."""

    def __init__(self, message: str, status: int = 0, body: Any = None, *, sent: bool = True) -> None:
        super().__init__(message)
        self.status = status
        self.body = body
        self.sent = sent

    @property
    def code(self) -> str | None:
        if isinstance(self.body, dict) and isinstance(self.body.get("error"), dict):
            code = self.body["error"].get("code")
            return code if isinstance(code, str) else None
        return None

    @property
    def retriable_body(self) -> bool:
        """The answer's body says the same request may succeed later (`"retriable": true`)."""
        return isinstance(self.body, dict) and parse_error(self.body).retriable

    @property
    def transient(self) -> bool:
        """The same call may succeed later unchanged: no answer at all (connection refused or reset, a
        timeout), a server error (5xx), too many requests (429), or a body that says `"retriable": true`.
        Everything else (a refusal, an answer that cannot be read, a setup error) is permanent."""
        return self.status == 0 or self.status >= 500 or self.status in RETRY_STATUSES or self.retriable_body

    @property
    def unsent(self) -> bool:
        """Transient, and the request cannot have been applied (the connection was refused before it
        left, 429, a retriable body): safe to retry even a send."""
        return self.transient and (not self.sent or self.status in RETRY_STATUSES or self.retriable_body)


class LeaseRefused(GatewayError):
    """A fenced ack/renew was refused (409): the claim's token is stale or the message is not in flight."""

    @property
    def ids(self) -> list[str]:
        if isinstance(self.body, dict):
            details = (self.body.get("error") or {}).get("details") or {}
            ids = details.get("ids")
            if isinstance(ids, list):
                return [i for i in ids if isinstance(i, str)]
        return []


class ResultsUnsupported(GatewayError):
    """The gateway has no results route (an older version): ack and release are all it takes."""


class MalformedPollItem(GatewayError):
    """A poll answer item the SDK cannot read (a field missing or of the wrong type): a gateway of another
    version, or something that is not a strictq gateway. `items` holds what the same poll claimed and could
    be read, so the caller can hand it back."""

    def __init__(self, message: str, body: Any = None, items: tuple[Any, ...] = ()) -> None:
        super().__init__(message, 200, body)
        self.items = items


class AuthRefused(SetupError, GatewayError):
    """The gateway does not take the credential (401, or 403: unknown key or a role that may not do this);
    the message names the settings the key came from."""

    @property
    def transient(self) -> bool:
        return False  # no retry can fix a setting


class TLSFailed(SetupError, GatewayError):
    """The TLS handshake with the gateway failed for good: its certificate cannot be verified with the CA
    the settings name (STRICTQ_CA_FILE, or the system trust store), or the server does not speak TLS."""

    @property
    def transient(self) -> bool:
        return False  # no retry can fix a setting
