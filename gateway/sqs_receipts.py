"""SQS receipt handles that cannot be guessed: `<token hex>.<mac>.<message id>`.

The core's receipt names a claim by its fencing token and the message id, and fencing tokens count up by
one (fencing needs their order), so a worker could delete another worker's message by trying tokens near
its own. The SQS face therefore authenticates every handle it hands out: `mac` is HMAC-SHA256 over the
queue's internal name (`<tenant>.<queue>`), the token and the message id, its first 16 bytes in
base64url, under a server key. DeleteMessage(Batch) and ChangeMessageVisibility(Batch) verify it in
constant time; a forged or tampered handle is `ReceiptHandleIsInvalid`, as SQS answers a handle it never
issued. A handle is bound to its queue, so it does not work on another queue or tenant either.

The key is 32 random bytes in `<data-dir>/receipt.key` (hex), created once with mode 0600 and never
rewritten: handles stay valid across restarts, and every gateway process on the same data directory
shares the key. Without a key file (tests, tools) the key lives in memory for the process's lifetime.
"""

from __future__ import annotations

import base64
import hmac
import os
import secrets
from pathlib import Path

from aiohttp import web

from wirelog.files import StartupError, private_dir, write_private

from .sqs_hmac import KeyedHmac

KEY_BYTES = 32
MAC_BYTES = 16  # 128 bits: far beyond guessing within a claim's life (at most 12 hours)
MAX_HANDLE = 1024  # SQS's own limit on a receipt handle
MAX_TOKEN_HEX = 16  # tokens are 64-bit


class ReceiptKeyError(StartupError):
    """The receipt key file cannot be read or is not a key (one line at start: the file and the fix)."""


def _create_once(path: Path, data: bytes) -> None:
    """Write `data` to `path` unless it exists: 0600 from the start (wirelog.files.write_private: the
    mode is given to `os.open`, never chmod'ed after the secret is in), then hard-linked into place, which
    fails if the file exists. A concurrent reader never sees a partial key, and when two gateway
    processes on one data dir start together, the first key wins whole and both use it (a rename would
    let the second replace the key the first already signs with)."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.new")
    write_private(temporary, data)
    try:
        os.link(temporary, path)
    except FileExistsError:
        pass  # another gateway process on this data directory made it first: use that one
    finally:
        temporary.unlink(missing_ok=True)


class ReceiptSigner:
    """Signs and verifies the SQS face's receipt handles with one server key."""

    def __init__(self, key: bytes) -> None:
        if len(key) < KEY_BYTES:
            raise ValueError(f"a receipt key needs at least {KEY_BYTES} bytes")
        self._mac_of = KeyedHmac(key)

    @classmethod
    def ephemeral(cls) -> ReceiptSigner:
        """A key for this process only: handles do not survive a restart (no data directory)."""
        return cls(secrets.token_bytes(KEY_BYTES))

    @classmethod
    def load(cls, path: Path) -> ReceiptSigner:
        """The key in `path`, made first if the file does not exist."""
        try:
            if not path.exists():
                private_dir(path.parent)
                _create_once(path, secrets.token_bytes(KEY_BYTES).hex().encode() + b"\n")
            text = path.read_bytes().decode("ascii").strip()
            key = bytes.fromhex(text)
        except OSError as exc:
            raise ReceiptKeyError(
                path,
                f"cannot read or create the SQS receipt key ({exc.strerror or exc})",
                "check that this user can read and write it and its directory",
            ) from None
        except ValueError:
            key = b""
        if len(key) != KEY_BYTES:
            raise ReceiptKeyError(
                path,
                f"not an SQS receipt key ({2 * KEY_BYTES} hex digits expected)",
                "restore it from a backup, or delete it to make a new one (receipt handles given out"
                " before then stop working)",
            )
        return cls(key)

    def _mac(self, queue: str, token: int, message_id: str) -> str:
        data = "\x00".join((queue, f"{token:x}", message_id)).encode("utf-8", "surrogatepass")
        digest = self._mac_of.digest(data)[:MAC_BYTES]
        return base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")

    def sign(self, queue: str, token: int, message_id: str) -> str:
        """The handle for a delivery of `message_id` in `queue` (internal name) under claim `token`."""
        return f"{token:x}.{self._mac(queue, token, message_id)}.{message_id}"

    def verify(self, queue: str, handle: object) -> tuple[str, int] | None:
        """(message id, token) of a handle this face issued for `queue`; None for anything else."""
        if not isinstance(handle, str) or len(handle) > MAX_HANDLE or not handle.isascii():
            return None
        parts = handle.split(".", 2)
        if len(parts) != 3:
            return None
        token_hex, mac, message_id = parts
        if not 0 < len(token_hex) <= MAX_TOKEN_HEX or not message_id:
            return None
        try:
            token = int(token_hex, 16)
        except ValueError:
            return None
        if f"{token:x}" != token_hex:  # one spelling per token ('+1', '0x1', '01' are not ours)
            return None
        if not hmac.compare_digest(self._mac(queue, token, message_id), mac):
            return None
        return message_id, token


RECEIPTS = web.AppKey("sqs_receipts", ReceiptSigner)
