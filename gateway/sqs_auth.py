"""SigV4 verification for the SQS face, with botocore's own signer computing the expected signature.

The request is rebuilt as a botocore AWSRequest from the headers the client signed, the body and the
timestamp it sent; SigV4Auth then derives the canonical request, string to sign and signature with the
credential's secret, exactly as the client did. Any region is accepted; the service must be `sqs`.
"""

from __future__ import annotations

import calendar
import hashlib
import hmac
import time
from dataclasses import dataclass

from aiohttp import web
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from access.keys import Credential, KeyRing

from .sqs_errors import SqsError

ALGORITHM = "AWS4-HMAC-SHA256"
SERVICE_NAME = "sqs"
MAX_SKEW = 15 * 60.0
UNSIGNED_PAYLOAD = "UNSIGNED-PAYLOAD"


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
    if "X-Amz-Security-Token" in request.headers:
        raise SqsError(
            "InvalidClientTokenId", "Session tokens are not supported: sign with the access key alone."
        )
    amz_date = request.headers.get("X-Amz-Date", "")
    try:
        signed_at = calendar.timegm(time.strptime(amz_date, "%Y%m%dT%H%M%SZ"))
    except ValueError:
        raise SqsError("IncompleteSignature", "The request must carry a valid X-Amz-Date header.") from None
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
    headers: dict[str, str] = {}
    for name in names:
        values = request.headers.getall(name, [])
        if not values:
            raise SqsError("SignatureDoesNotMatch", f"Signed header {name!r} is missing from the request.")
        headers[name] = ",".join(values)
    content_sha = headers.get("x-amz-content-sha256")
    if content_sha is not None and content_sha != UNSIGNED_PAYLOAD:
        if not hmac.compare_digest(content_sha, hashlib.sha256(body).hexdigest()):
            raise SqsError("SignatureDoesNotMatch", "X-Amz-Content-SHA256 does not match the request body.")
    url = f"{request.scheme}://{request.host}{request.path}"
    if request.query_string:
        url = f"{url}?{request.query_string}"
    rebuilt = AWSRequest(method=request.method, url=url, data=body, headers=headers)
    rebuilt.context["timestamp"] = amz_date
    signer = SigV4Auth(Credentials(credential.id, credential.secret), SERVICE_NAME, auth.region)
    if signer.signed_headers(signer.headers_to_sign(rebuilt)) != ";".join(names):
        raise SqsError("SignatureDoesNotMatch", "SignedHeaders names a header that cannot be signed.")
    canonical = signer.canonical_request(rebuilt)
    expected = signer.signature(signer.string_to_sign(rebuilt, canonical), rebuilt)
    if not hmac.compare_digest(expected, auth.signature):
        raise SqsError(
            "SignatureDoesNotMatch",
            "The request signature we calculated does not match the signature you provided. Check your AWS"
            " Secret Access Key and signing method.",
        )
