"""SigV4 verification for the SQS face: the expected signature computed as botocore's SigV4Auth computes it.

Hand-written on purpose (botocore stays the reference: tests/test_sqs_sigv4.py compares the two on random
requests). botocore's signer, driven per request, rebuilt an AWSRequest, re-parsed its URL, walked its
headers through email.message, hashed the body through its preparer and re-derived the signing key with
four HMACs: ~56 µs per request, the largest single cost of the SQS face. Here the canonical request is
built once from the headers the client signed, the signing key is cached per (access key, secret, date,
region) (the service is always `sqs`), and the canonical path and query of a URL and the parse of an
X-Amz-Date are cached too (a face sees one URL, and one timestamp per second per client). What is checked
and in which order is unchanged: any region is accepted here (sqs_regions narrows it); the service must be
`sqs`; SignedHeaders must be sorted, lowercase, distinct, signable and include host.
"""

from __future__ import annotations

import calendar
import hashlib
import hmac
import time
from dataclasses import dataclass
from functools import lru_cache
from urllib.parse import quote, urlsplit

from aiohttp import web
from botocore.auth import SIGNED_HEADERS_BLACKLIST
from botocore.utils import normalize_url_path

from access.keys import Credential, KeyRing

from .sqs_errors import SqsError
from .sqs_hmac import KeyedHmac

ALGORITHM = "AWS4-HMAC-SHA256"
SERVICE_NAME = "sqs"
MAX_SKEW = 15 * 60.0
UNSIGNED_PAYLOAD = "UNSIGNED-PAYLOAD"
UNSIGNABLE = frozenset(SIGNED_HEADERS_BLACKLIST)  # botocore leaves these out of what it signs
SIGNING_KEYS = 1024  # cached signing keys: a key per credential, day and region in use
MISMATCH = (
    "The request signature we calculated does not match the signature you provided. Check your AWS Secret"
    " Access Key and signing method."
)


@dataclass(frozen=True, slots=True)
class Authorization:
    """The parsed Authorization header: who claims to sign, where, which headers, and the signature."""

    key_id: str
    date: str
    region: str
    service: str
    signed_headers: tuple[str, ...]
    signature: str


def parse_authorization(request: web.Request) -> Authorization:
    header = request.headers.get("Authorization")
    if header is None:
        if "X-Amz-Signature" in request.query:
            raise SqsError(
                "MissingAuthenticationToken", "Presigned requests are not supported; sign the headers."
            )
        raise SqsError("MissingAuthenticationToken", "Request is missing Authentication Token")
    algorithm, _, rest = header.strip().partition(" ")
    if algorithm != ALGORITHM:
        raise SqsError("IncompleteSignature", f"Unsupported authorization algorithm; use {ALGORITHM}.")
    fields: dict[str, str] = {}
    for part in rest.split(","):
        name, _, value = part.strip().partition("=")
        fields[name] = value
    try:
        scope = fields["Credential"].split("/")
        signed = fields["SignedHeaders"]
        signature = fields["Signature"]
    except KeyError as missing:
        raise SqsError("IncompleteSignature", f"Authorization header requires '{missing.args[0]}'.") from None
    if len(scope) != 5 or scope[4] != "aws4_request" or not all(scope) or not signed or not signature:
        raise SqsError("IncompleteSignature", "Authorization header is not a valid SigV4 authorization.")
    key_id, date, region, service, _ = scope
    return Authorization(key_id, date, region, service, tuple(signed.split(";")), signature)


def identify(auth: Authorization, keys: KeyRing) -> Credential:
    """The credential the request claims to be signed with (not yet verified)."""
    credential = keys.by_id(auth.key_id)
    if credential is None:
        raise SqsError("InvalidClientTokenId", "The security token included in the request is invalid.")
    return credential


def verify(
    request: web.Request, body: bytes, auth: Authorization, credential: Credential, now: float | None = None
) -> None:
    """Raise unless `auth` is a valid SigV4 signature of this request by `credential`'s secret."""
    if auth.service != SERVICE_NAME:
        raise SqsError(
            "SignatureDoesNotMatch", f"Credential should be scoped to correct service: '{SERVICE_NAME}'."
        )
    headers = request.headers
    if "X-Amz-Security-Token" in headers:
        raise SqsError(
            "InvalidClientTokenId", "Session tokens are not supported: sign with the access key alone."
        )
    amz_date = headers.get("X-Amz-Date", "")
    signed_at = _signed_at(amz_date)
    if signed_at is None:
        raise SqsError("IncompleteSignature", "The request must carry a valid X-Amz-Date header.")
    if amz_date[:8] != auth.date:
        raise SqsError("SignatureDoesNotMatch", "Credential scope date does not match X-Amz-Date.")
    now = time.time() if now is None else now
    if abs(now - signed_at) > MAX_SKEW:
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now))
        raise SqsError(
            "SignatureDoesNotMatch",
            f"Signature expired: {amz_date} is not within 15 minutes of the server time {stamp}.",
        )
    names = auth.signed_headers
    if "host" not in names or list(names) != sorted(names):
        raise SqsError("SignatureDoesNotMatch", "SignedHeaders must be sorted, lowercase and include host.")
    values: dict[str, str] = {}
    for name in names:
        found = headers.getall(name, ())
        if not found:
            raise SqsError("SignatureDoesNotMatch", f"Signed header {name!r} is missing from the request.")
        values[name] = ",".join(found)
    # The payload line of the canonical request: botocore takes the signed X-Amz-Content-SHA256 as given
    # (checked against the body here unless UNSIGNED-PAYLOAD), and hashes the body otherwise.
    payload = values.get("x-amz-content-sha256")
    if payload is None:
        payload = hashlib.sha256(body).hexdigest()
    elif payload != UNSIGNED_PAYLOAD and not hmac.compare_digest(
        payload.encode("utf-8", "surrogateescape"), hashlib.sha256(body).hexdigest().encode("ascii")
    ):
        raise SqsError("SignatureDoesNotMatch", "X-Amz-Content-SHA256 does not match the request body.")
    if not _signable(names):
        raise SqsError("SignatureDoesNotMatch", "SignedHeaders names a header that cannot be signed.")
    # From here each name is lowercase and distinct with exactly one (joined) value, as botocore saw it.
    url = f"{request.scheme}://{request.host}{request.path}"
    if request.query_string:
        url = f"{url}?{request.query_string}"
    path, query = _canonical_target(url)
    canonical_headers = "\n".join(f"{n}:{' '.join(values[n].split())}" for n in names)
    canonical = (
        f"{request.method.upper()}\n{path}\n{query}\n{canonical_headers}\n\n{';'.join(names)}\n{payload}"
    )
    try:
        digest = hashlib.sha256(canonical.encode("utf-8")).hexdigest()
        scope = f"{auth.date}/{auth.region}/{SERVICE_NAME}/aws4_request"
        to_sign = f"{ALGORITHM}\n{amz_date}\n{scope}\n{digest}".encode()
        key = _signing_key(credential.id, credential.secret, auth.date, auth.region)
        given = auth.signature.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # undecodable bytes in a header or the path: nothing a client could sign
        raise SqsError("SignatureDoesNotMatch", MISMATCH) from None
    expected = key.hexdigest(to_sign).encode("ascii")
    if not hmac.compare_digest(expected, given):
        raise SqsError("SignatureDoesNotMatch", MISMATCH)


@lru_cache(maxsize=SIGNING_KEYS)
def _signing_key(key_id: str, secret: str, date: str, region: str) -> KeyedHmac:
    """SigV4's derived key (HMAC over date, region, service and `aws4_request`, pads ready: sqs_hmac): the
    same for every request of a credential on one day in one region. `key_id` and `secret` both key the
    cache, so a rotated secret never meets a key derived from the old one."""
    del key_id  # part of the cache key only
    key = f"AWS4{secret}".encode()
    for part in (date, region, SERVICE_NAME, "aws4_request"):
        key = hmac.digest(key, part.encode("utf-8"), "sha256")
    return KeyedHmac(key)


@lru_cache(maxsize=256)
def _signable(names: tuple[str, ...]) -> bool:
    """Whether botocore would sign exactly these names: it lowercases, drops its blacklist, strips,
    deduplicates and sorts; unless that gives SignedHeaders back, a name could not have been signed as
    given. (A client sends the same few SignedHeaders every time: cached.)"""
    signable = sorted({n.lower().strip() for n in names if n.lower() not in UNSIGNABLE})
    return ";".join(signable) == ";".join(names)


@lru_cache(maxsize=64)
def _signed_at(amz_date: str) -> int | None:
    """X-Amz-Date in seconds since the epoch (None: not `YYYYMMDDTHHMMSSZ`); strptime's own leniency kept."""
    try:
        return calendar.timegm(time.strptime(amz_date, "%Y%m%dT%H%M%SZ"))
    except ValueError:
        return None


@lru_cache(maxsize=256)
def _canonical_target(url: str) -> tuple[str, str]:
    """The canonical URI and query string of `url`, as botocore derives them from the URL it signs:
    dot segments and empty segments removed, then percent-encoded except `/~`; the query's pairs sorted
    as they are (already encoded by the client)."""
    parts = urlsplit(url)
    path = quote(normalize_url_path(parts.path), safe="/~")
    pairs = []
    for pair in parts.query.split("&") if parts.query else ():
        key, _, value = pair.partition("=")
        pairs.append((key, value))
    return path, "&".join(f"{key}={value}" for key, value in sorted(pairs))
