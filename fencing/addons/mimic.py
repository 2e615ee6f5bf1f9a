"""Mimic addon: answer a call from recorded responses when the fence addon said so.

The fence addon (just before this one in the chain) decides which calls are answered from recordings
and leaves its verdict on the flow (`fencing.answering.mark_mimic`): a mimic-fenced worker's calls, a
block-fenced worker's mimic probe, every call in replay mode. This addon answers those at `request`
from the recordings, with `ctx.action = "mimic"` and `ctx.replayed_from` = the record id; nothing
matching: 503 `unmatched`. A call without the verdict is none of its business. Either way a call it
sees is never forwarded.

Two sources of recordings, one way of answering (`fencing.answering`, per-worker `Cursors`):
- mimic (`fencing.mimic.RecordingIndex`): the live wire log, `strictq_mimic_wirelog` (empty: the
  capture addon's `strictq_wirelog`, the proxy's own wire log). Loaded when a worker is mimic-fenced,
  re-read on a miss at most every `strictq_mimic_refresh` seconds, bounded by
  `strictq_mimic_max_records` / `strictq_mimic_max_bytes`, dropped when nobody is mimic-fenced.
- replay (`strictq_replay`, set by `strictq proxy --replay-from DIR`, used by `strictq replay`): the
  whole recording in `strictq_mimic_wirelog`, read once at start (`fencing.replay.matching`: per
  message and ordinal first, then by identity), with the masks of `strictq_replay_mask` (a JSON/TOML
  file, `fencing.replay.masking`) applied to both sides. The fence addon reads `strictq_replay` too: in
  replay mode every worker counts as mimic-fenced.

A new fence (or none) for a worker starts its recorded sequences over.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable
from pathlib import Path
from typing import TYPE_CHECKING

from mitmproxy import ctx, exceptions, http
from mitmproxy.addonmanager import Loader

from fencing.answering import answer_from, mimic_verdict, unmatched
from fencing.context import CallContext, context_of
from fencing.control_client import ControlState, FenceInfo
from fencing.mimic import Cursors, RecordingIndex, scan

if TYPE_CHECKING:
    from fencing.replay.masking import Masker
    from fencing.replay.matching import ReplayIndex

logger = logging.getLogger(__name__)

WIRELOG_OPTION = "strictq_wirelog"  # the capture addon's: read when strictq_mimic_wirelog is empty


class Mimic:
    """Answers the calls the fence marked for mimicry from recorded responses (503 when none match)."""

    def __init__(self, state: ControlState) -> None:
        self.state = state
        self.cursors = Cursors()
        self.index: RecordingIndex | ReplayIndex | None = None
        self.replay = False  # every call comes from the fixed recording (replay mode)
        self._masker: Masker | None = None
        self._loading: asyncio.Task[None] | None = None
        self._directory: Path | None = None
        self._refresh = 2.0
        self._max_records = 200_000
        self._max_bytes = 256 * 1024 * 1024
        self.mimicked = 0
        self.unmatched = 0
        state.add_listener(self._on_fence_change)

    # -- options ------------------------------------------------------------------------------------------
    def load(self, loader: Loader) -> None:
        add = loader.add_option
        add("strictq_mimic_wirelog", str, "", "Wire-log directory to mimic from; empty: strictq_wirelog.")
        add("strictq_mimic_refresh", float, 2.0, "Seconds between re-reads of the wire log on a miss.")
        add("strictq_mimic_max_records", int, 200_000, "Recordings kept in memory for mimicry.")
        add("strictq_mimic_max_bytes", int, 256 * 1024 * 1024, "Bytes of recordings kept in memory.")
        add("strictq_replay", bool, False, "Replay mode: answer every worker's calls from the recordings.")
        add("strictq_replay_mask", str, "", "Replay mode: mask config (JSON/TOML) for matching.")

    def configure(self, updated: set[str]) -> None:
        opts = ctx.options
        if updated & {"strictq_mimic_wirelog", WIRELOG_OPTION}:
            self._directory = self._wirelog_directory()
            self.index = None  # reloaded lazily from the new place
        if "strictq_mimic_refresh" in updated:
            if opts.strictq_mimic_refresh < 0:
                raise exceptions.OptionsError("strictq_mimic_refresh must be >= 0")
            self._refresh = opts.strictq_mimic_refresh
        if updated & {"strictq_replay", "strictq_replay_mask"}:
            self._configure_replay(opts.strictq_replay, opts.strictq_replay_mask)
        if updated & {"strictq_mimic_max_records", "strictq_mimic_max_bytes"}:
            records, size = opts.strictq_mimic_max_records, opts.strictq_mimic_max_bytes
            if records < 1 or size < 1:
                raise exceptions.OptionsError("strictq_mimic_max_records and _max_bytes must be positive")
            self._max_records, self._max_bytes = records, size
            self.index = None

    def _configure_replay(self, replay: bool, mask: str) -> None:
        self._masker = None
        if replay and mask:
            from fencing.replay.masking import MaskConfig, Masker, MaskError

            try:
                self._masker = Masker(MaskConfig.load(Path(mask)))
            except MaskError as exc:
                raise exceptions.OptionsError(f"strictq_replay_mask: {exc}") from exc
        self.replay = replay
        self.index = None  # reloaded (as a replay index or not) on the next call

    def _wirelog_directory(self) -> Path | None:
        opts = ctx.options
        for name in ("strictq_mimic_wirelog", WIRELOG_OPTION):
            value = getattr(opts, name, None) if name in opts else None
            if isinstance(value, str) and value:
                return Path(value)
        return None

    def running(self) -> None:
        """Read the recordings ahead of the first call when someone is to be answered from them."""
        if self.replay or any(f.mode == "mimic" for f in self.state.fences.values()):
            self._start_loading()

    # -- hooks --------------------------------------------------------------------------------------------
    def request(self, flow: http.HTTPFlow) -> Awaitable[None] | None:
        if flow.response is not None or mimic_verdict(flow) is None:
            return None
        call = context_of(flow)
        if call is None or call.worker is None:
            return None
        return self._mimic(flow, call)

    # -- answering ----------------------------------------------------------------------------------------
    def _mimic(self, flow: http.HTTPFlow, call: CallContext) -> Awaitable[None] | None:
        index = self.index
        if index is None:
            return self._mimic_after_load(flow, call)
        if self._answer(flow, call, index):
            return None
        if not self.replay and time.monotonic() - index.loaded_at >= self._refresh:
            return self._mimic_after_load(flow, call)  # maybe it was recorded since the last read
        self._unmatched(flow, call)
        return None

    async def _mimic_after_load(self, flow: http.HTTPFlow, call: CallContext) -> None:
        await self._start_loading()
        index = self.index
        if index is None or not self._answer(flow, call, index):
            self._unmatched(flow, call)

    def _answer(self, flow: http.HTTPFlow, call: CallContext, index: RecordingIndex | ReplayIndex) -> bool:
        identity = call.request_identity
        if identity is None:
            return False
        if self._masker is not None:
            from fencing.replay.matching import masked_identity

            identity = masked_identity(identity, call.request_view, self._masker)
        found = index.candidates(identity, call.message_id, call.call)
        if found is None:
            return False
        key, sequence = found
        assert call.worker is not None
        answer_from(flow, call, self.cursors.next(call.worker, key, sequence))
        self.mimicked += 1
        return True

    def _unmatched(self, flow: http.HTTPFlow, call: CallContext) -> None:
        self.unmatched += 1
        unmatched(flow, call, "replay mode" if self.replay else "fenced (mimic)")

    # -- loading ------------------------------------------------------------------------------------------
    def _start_loading(self) -> asyncio.Task[None]:
        """One (re)load at a time: readers of the same miss share it."""
        if self._loading is None or self._loading.done():
            self._loading = asyncio.get_running_loop().create_task(self._load(), name="mimic: load wire log")
        return self._loading

    async def _load(self) -> None:
        if self.replay:
            await self._load_replay()
            return
        directory = self._directory
        if directory is None:
            logger.warning("mimic: no wire-log directory configured; every mimicked call is unmatched")
            if self.index is None:
                self.index = RecordingIndex(self._max_records, self._max_bytes)
            self.index.loaded_at = time.monotonic()
            return
        current = self.index  # None or (the mode having been reset to None on a switch) a RecordingIndex
        if isinstance(current, RecordingIndex) and current:
            index = current
        else:
            index = RecordingIndex(self._max_records, self._max_bytes)
        try:
            result = await asyncio.to_thread(scan, directory, dict(index.files), set(index.ids))
        except Exception:
            logger.exception("mimic: cannot read the wire log in %s", directory)
            index.loaded_at = time.monotonic()
            self.index = index
            return
        added = index.merge(result)
        self.index = index
        logger.info("mimic: %d new recordings from %s (%d in memory)", added, directory, len(index))

    async def _load_replay(self) -> None:
        """The whole recording, once (it does not change while a replay runs)."""
        from fencing.replay.matching import ReplayIndex, load_index

        if isinstance(self.index, ReplayIndex):
            return
        directory = self._directory
        if directory is None:
            logger.warning("replay: no recording directory configured; every call is unmatched")
            self.index = ReplayIndex(masker=self._masker)
            return
        try:
            index = await asyncio.to_thread(load_index, directory, self._masker)
        except Exception:
            logger.exception("replay: cannot read the recording in %s", directory)
            index = ReplayIndex(masker=self._masker)
        self.index = index
        logger.info(
            "replay: %d recordings from %s (%d unreadable segments)", len(index), directory, index.errors
        )

    # -- fence changes ------------------------------------------------------------------------------------
    def _on_fence_change(self, kind: str, worker: str, fence: FenceInfo | None) -> None:
        self.cursors.reset(worker)  # a new fence (or none) starts the worker's sequences over
        if kind != "fence" or fence is None:
            if (
                self.index is not None
                and not self.replay
                and not any(f.mode == "mimic" for f in self.state.fences.values())
            ):
                self.index = None  # nobody to mimic for: free the memory, reload when needed
            return
        if fence.mode == "mimic":
            try:
                self._start_loading()
            except RuntimeError:  # no running loop (state applied outside the proxy): load lazily
                pass
