"""Answering a call from a recording: the hand-over from the fence addon to the mimic addon.

The fence addon decides *whether* a worker's call is answered from recordings (a mimic fence, a mimic
probe, replay mode) and says so on the flow (`mark_mimic`); the mimic addon, next in the chain, reads
that verdict (`mimic_verdict`) and answers (`answer_from`, or `unmatched`). Neither addon calls the
other: the flow's metadata carries the decision, as `CallContext` carries the rest.
"""

from __future__ import annotations

from mitmproxy import http

from fencing.context import PROXY_ACTION_HEADER, CallContext, refuse
from fencing.control_client import FenceInfo
from fencing.mimic import Recording
from protocol import errors
from wirelog.record import ACTION_MIMIC, ACTION_UNMATCHED

# flow.metadata key: the FenceInfo (mode "mimic") the call is answered under; absent: not the mimic's call.
MIMIC_KEY = "strictq.mimic"


def mark_mimic(flow: http.HTTPFlow, fence: FenceInfo | None) -> None:
    """Set (a fence in mode mimic) or clear (None) the flow's verdict; the fence addon's, at `request`."""
    if fence is None:
        flow.metadata.pop(MIMIC_KEY, None)
    else:
        flow.metadata[MIMIC_KEY] = fence


def mimic_verdict(flow: http.HTTPFlow) -> FenceInfo | None:
    """The fence the call is to be answered from recordings under, or None."""
    value = flow.metadata.get(MIMIC_KEY)
    return value if isinstance(value, FenceInfo) else None


def answer_from(flow: http.HTTPFlow, call: CallContext, recording: Recording) -> None:
    """Answer the call with a recorded response (`action` mimic, `replayed_from` its record id)."""
    call.action = ACTION_MIMIC
    call.code = None
    call.replayed_from = recording.record_id
    headers = http.Headers([(k.encode(), v.encode()) for k, v in recording.headers])
    headers[PROXY_ACTION_HEADER] = ACTION_MIMIC
    flow.response = http.Response.make(recording.status, recording.body, headers)


def unmatched(flow: http.HTTPFlow, call: CallContext, why: str) -> None:
    """503 `unmatched`: the call is to be answered from recordings and none matched (never forwarded)."""
    method, host, path = flow.request.method, flow.request.pretty_host, flow.request.path
    refuse(
        flow,
        call,
        status=503,
        action=ACTION_UNMATCHED,
        code=errors.UNMATCHED,
        message=f"worker {call.worker} is {why} and no recording matched {method} {host}{path}",
    )
