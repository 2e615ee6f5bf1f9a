"""Every gateway request gets a request id (protocol.request_ids), and every answer names it.

The id is the client's `X-Request-Id` when that is well formed, else a new one; it is worked out once, on
first use (`request_id_of`), so a request nobody asks about costs one header lookup and one getrandom
call. One id per request on both faces: the EmoDB face (and every other route of the gateway) answers
`X-Request-Id: <id>` and puts it in its error bodies (`{"error": {...}, "request_id": <id>}`, emodb); the
SQS face answers it as `x-amzn-RequestId`, as SQS does (botocore shows it as ResponseMetadata.RequestId),
and adds `X-Request-Id` only for a client that sent one, so a plain boto3 client sees SQS's headers.

A send's id is kept with each message it sent (`SendRequest.request_id`, durable in the store) and comes
back with the message's deliveries to workers that ask for it.
"""

from __future__ import annotations

from aiohttp import web

from protocol import headers
from protocol.request_ids import accept_request_id

REQUEST_ID = web.RequestKey("strictq_request_id", str)


def request_id_of(request: web.BaseRequest) -> str:
    """The request's id (the client's if well formed, else a new one), the same every time it is asked."""
    found = request.get(REQUEST_ID)
    if found is None:
        found = request[REQUEST_ID] = accept_request_id(request.headers.get(headers.REQUEST_ID))
    return found


async def name_response(request: web.BaseRequest, response: web.StreamResponse) -> None:
    """`on_response_prepare`: every answer (errors and streams included) names its request's id."""
    request_id = request_id_of(request)
    if headers.AMZN_REQUEST_ID in response.headers:  # the SQS face: AWS's header holds it already
        if headers.REQUEST_ID in request.headers:
            response.headers[headers.REQUEST_ID] = request_id
    else:
        response.headers[headers.REQUEST_ID] = request_id


def add_request_ids(app: web.Application) -> None:
    app.on_response_prepare.append(name_response)
