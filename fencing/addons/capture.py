"""Capture addon: one wire-log record (schema v1, kind `http`) per call through the proxy, whatever
happened: passed, refused by auth (407), tagging (400) or a guard, answered by mimicry, or failed
upstream (the `error` hook: the worker got a 502 with the reason, the record has `error`).

A record's `request_id` is the worker's `X-Strictq-Request-Id` tag: the id of the request that sent the
message the call was made for (null for untagged calls and workers that do not send it).

Records name the tagged queue as delivery records do: `queue` is the name the worker sees and `face` the
face of the tag's reference (`queue`, or `dedupq` for an EmoDB dedup queue), so a dedup queue's calls
are not taken for those of the plain queue of the same name, and `--queue NAME` searches find both.

Runs after the guards, so `CallContext.action`/`code` are final. It writes only the redacted views the
redact addon built (`ctx.request_view` / `ctx.response_view`): no request or response content reaches
disk any other way. Records are built by `wirelog.record.http_record` (the schema's one builder)
plus the proxy's own fields, and encoded by the writer with orjson into a buffer; a timer
calls the writer's `tick` (interval flush and fsync, age rotation), and `done` closes it (SIGTERM).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from pathlib import Path
from typing import Any

from mitmproxy import exceptions, http
from mitmproxy.addonmanager import Loader

from fencing.context import CallContext, ensure_context
from fencing.runtime import ProxyRuntime
from wirelog.record import http_record
from wirelog.writer import FSYNC_POLICIES, WireLogWriter, default_segment_age

log = logging.getLogger("strictq.proxy.capture")


class Capture:
    def __init__(self, runtime: ProxyRuntime) -> None:
        self.runtime = runtime
        self.writer: WireLogWriter | None = None
        self.tick_interval = 0.25
        self._ticker: asyncio.Task[None] | None = None
        self._redact: Any = None  # the Redact addon, for calls that never reached its hooks

    def load(self, loader: Loader) -> None:
        add = loader.add_option
        add("strictq_wirelog", str, "", "Wire-log directory; empty: capture off.")
        add("strictq_wirelog_fsync", str, "interval", "fsync policy: always | interval | never.")
        add("strictq_wirelog_fsync_interval", float, 1.0, "Seconds between fsyncs (policy interval).")
        add("strictq_wirelog_segment_bytes", int, 64 * 1024 * 1024, "Rotate segments at this size.")
        add(  # the writers' default (30 s, $STRICTQ_WIRELOG_SEGMENT_AGE): indexable within a minute
            "strictq_wirelog_segment_age", float, default_segment_age(), "Rotate segments at this age (s)."
        )
        add("strictq_wirelog_compress", bool, True, "gzip closed segments.")
        add("strictq_wirelog_tick", float, 0.25, "Seconds between flushes of buffered records.")

    def configure(self, updated: set[str]) -> None:
        from mitmproxy import ctx

        opts = ctx.options
        if "strictq_wirelog_fsync" in updated and opts.strictq_wirelog_fsync not in FSYNC_POLICIES:
            raise exceptions.OptionsError(f"strictq_wirelog_fsync must be one of {', '.join(FSYNC_POLICIES)}")
        if "strictq_wirelog_tick" in updated:
            self.tick_interval = max(0.01, opts.strictq_wirelog_tick)
        if not updated & {
            "strictq_wirelog",
            "strictq_wirelog_fsync",
            "strictq_wirelog_fsync_interval",
            "strictq_wirelog_segment_bytes",
            "strictq_wirelog_segment_age",
            "strictq_wirelog_compress",
        }:
            return
        if self.writer is not None:
            self.writer.close(wait=False)
            self.writer = None
        if opts.strictq_wirelog:
            try:
                self.writer = WireLogWriter(
                    Path(opts.strictq_wirelog),
                    self.runtime.name,
                    max_segment_bytes=opts.strictq_wirelog_segment_bytes,
                    max_segment_age=opts.strictq_wirelog_segment_age,
                    fsync=opts.strictq_wirelog_fsync,
                    fsync_interval=opts.strictq_wirelog_fsync_interval,
                    compress=opts.strictq_wirelog_compress,
                )
            except (OSError, ValueError) as exc:
                raise exceptions.OptionsError(f"wire log: {exc}") from exc
            except Exception as exc:  # wirelog's own errors (lock held by a live writer, ...)
                raise exceptions.OptionsError(f"wire log: {exc}") from exc

    def running(self) -> None:
        from mitmproxy import ctx

        self._redact = ctx.master.addons.get("redact")
        self._ticker = asyncio.create_task(self._tick_loop(), name="strictq-wirelog-tick")

    async def done(self) -> None:
        if self._ticker is not None:
            self._ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._ticker
        if self.writer is not None:
            writer, self.writer = self.writer, None
            # close() waits for the last segment's compression: not on the event loop
            await asyncio.to_thread(writer.close)

    async def _tick_loop(self) -> None:
        while True:
            await asyncio.sleep(self.tick_interval)
            if self.writer is not None:
                try:
                    self.writer.tick(time.time())
                except Exception:
                    self.runtime.count("capture.write_errors")
                    log.exception("wire-log tick failed")

    # ----------------------------------------------------------------------------------------- hooks
    def requestheaders(self, flow: http.HTTPFlow) -> None:
        self.runtime.in_flight += 1  # until its record is written (response or error)

    def response(self, flow: http.HTTPFlow) -> None:
        self._record(flow, ensure_context(flow), None)

    def error(self, flow: http.HTTPFlow) -> None:
        if flow.request.method == "CONNECT":  # a tunnel's own errors: its requests have their records
            return
        ctx = ensure_context(flow)
        message = flow.error.msg if flow.error is not None else "error"
        if ctx.error is None:
            ctx.error = message
        self.runtime.count("upstream.errors")
        self._record(flow, ctx, message)

    def http_connect_error(self, flow: http.HTTPFlow) -> None:
        """A CONNECT the proxy refused (407): no request inside the tunnel will ever be seen."""
        self._record(flow, ensure_context(flow), None)

    # -------------------------------------------------------------------------------------- internals
    def _record(self, flow: http.HTTPFlow, ctx: CallContext, error: str | None) -> None:
        if ctx.recorded:
            return
        ctx.recorded = True
        if flow.request.method != "CONNECT":  # CONNECTs never pass requestheaders
            self.runtime.in_flight -= 1
        metrics = self.runtime.metrics
        metrics["requests"] += 1
        metrics["action." + ctx.action] += 1
        if ctx.code is not None:
            metrics["code." + ctx.code] += 1
        response = flow.response
        if response is not None:
            metrics[f"status.{response.status_code // 100}xx"] += 1
        if self.writer is None:
            return
        request_view = ctx.request_view
        response_view = ctx.response_view
        if self._redact is not None and (
            request_view is None or (response is not None and response_view is None)
        ):
            # A call that skipped the redact addon's hooks (an error before the request was complete,
            # a CONNECT refused): build the views now, the same way.
            self._redact.ensure_views(flow, ctx)
            request_view, response_view = ctx.request_view, ctx.response_view
        if request_view is None:
            request_view = {"method": flow.request.method, "url": None}
        record = http_record(
            request=request_view,
            response=response_view,
            action=ctx.action,
            error=error if error is not None else ctx.error,
            latency_ms=round((time.time() - ctx.started) * 1000.0, 3),
            replayed_from=ctx.replayed_from,
            ts=ctx.started,
            worker=ctx.worker,
            queue=ctx.queue,
            message_id=ctx.message_id,
            group=ctx.group,
            lease=ctx.lease,
            attempt=ctx.attempt,
            call=ctx.call,
            request_id=ctx.request_id,
        )
        record.update(
            tenant=ctx.tenant,
            face=ctx.face,  # `queue` | `dedupq`, from the tag's reference (null: no queue tag)
            tagged=ctx.tagged,
            code=ctx.code,
            level=ctx.log_level,
        )
        try:
            self.writer.write(record)
            metrics["records"] += 1
        except Exception:
            metrics["capture.write_errors"] += 1
            log.exception("cannot write a wire-log record")
