"""The regions the SQS face answers for.

A strictq endpoint has one set of queues per tenant: a queue is the same whatever region the caller signs
for (the SigV4 credential scope's region), and that region only names it in ARNs
(`arn:aws:sqs:<region>:<tenant>:<name>`). By default any region is accepted, so a client configured for
any region works unchanged. An operator who wants clients pinned to the regions of a deployment gives
them (`strictq serve --region us-east-1 --region eu-west-1`); a request signed for another region is then
refused as an SQS regional endpoint refuses one: SignatureDoesNotMatch (HTTP 403), "Credential should be
scoped to a valid region, not '<region>'.", and ARNs naming another region name no queue.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from .sqs_errors import SqsError

# AWS region names: `us-east-1`, `eu-central-2`, `us-gov-west-1`, `cn-north-1`; private deployments may
# use their own (`local`, `dc1`): letters, digits and hyphens, starting with a letter.
REGION_RE = re.compile(r"[a-z][a-z0-9-]{0,49}")


def parse_regions(values: Iterable[str]) -> frozenset[str] | None:
    """The configured regions, checked; None (any region) when none is given. ValueError names a bad one."""
    regions = frozenset(values)
    for region in sorted(regions):
        if not REGION_RE.fullmatch(region):
            raise ValueError(
                f"invalid region {region!r}: lowercase letters, digits and hyphens, starting with a letter"
            )
    return regions or None


def check_region(regions: frozenset[str] | None, region: str) -> None:
    """Refuse a request signed for a region this endpoint does not answer for, as SQS does."""
    if regions is not None and region not in regions:
        shown = region[:64].encode("ascii", "backslashreplace").decode("ascii")
        raise SqsError(
            "SignatureDoesNotMatch", f"Credential should be scoped to a valid region, not '{shown}'. "
        )
