"""Message move tasks (EmoDB `_move`, SQS StartMessageMoveTask): every message present when a move
starts goes to another queue, group by group and in order, a chunk per timer call.

Built on `CoreState.transfer`, the primitive the dead-letter and redrive paths of retries.py use too;
a group in flight is skipped and taken again when its claim ends (`CoreState.claim_ended`).
"""

from __future__ import annotations

from .errors import InvalidArgument, NotFound, NotInFlight
from .records import MoveStatus
from .state import CoreState, prefix
from .text import check_name

MOVE_CHUNK = 2000  # messages moved per timer call, so a big move never stalls the shell
CLUSTER_MOVE_PREFIX = "mv-c"  # ids a cluster gateway gives (the core's own are mv-<epoch>-<n>)
MAX_MOVE_ID = 64


class Moves:
    """Start, inspect, cancel and step move tasks (they live in memory: a restart forgets them)."""

    def __init__(self, state: CoreState) -> None:
        self.state = state

    def start(self, source: str, destination: str, now: float, move_id: str | None = None) -> MoveStatus:
        """EmoDB `_move`: asynchronously move every message present now, group by group, in order.
        `move_id`: the id a cluster gateway gives the move on every partition (one move over them all);
        a start repeated with it answers the move it started (a retry), None: the core names it."""
        state = self.state
        if move_id is not None:
            shaped = isinstance(move_id, str) and move_id.startswith(CLUSTER_MOVE_PREFIX)
            if not shaped or len(move_id) > MAX_MOVE_ID:
                raise InvalidArgument(
                    f"a move id starts {CLUSTER_MOVE_PREFIX!r}, at most {MAX_MOVE_ID} characters", field="id"
                )
            check_name(move_id, "id")
            known = state.moves.get(move_id)
            if known is not None:
                if (known.source, known.destination) != (source, destination):
                    raise InvalidArgument(f"move {move_id!r} moves another queue", field="id")
                return known
        src = state.queue(source)
        if source == destination:
            raise InvalidArgument("cannot move a queue onto itself", field="to")
        if destination not in state.queues:
            state.create_queue(destination, now)
        state.move_counter += 1
        move = MoveStatus(
            id=move_id or f"mv-{state.epoch:x}-{state.move_counter}",
            source=source,
            destination=destination,
            remaining=len(src.by_id),
            started_at=now,
            limit_key=state.last_key,
            pending_groups=list(src.groups),
        )
        if not move.pending_groups:  # nothing to move: done at once (the timer only steps pending work)
            move.state, move.finished_at = "done", now
        state.moves[move.id] = move
        return move

    def status(self, move_id: str) -> MoveStatus:
        move = self.state.moves.get(move_id)
        if move is None:
            raise NotFound(
                f"no move {move_id!r}: unknown, or started before the last restart (moves do not survive"
                " one; start it again, messages already moved stay moved)",
                reference=move_id,
            )
        return move

    def cancel(self, move_id: str, now: float) -> MoveStatus:
        """Stop a running move (SQS CancelMessageMoveTask): messages already moved stay moved."""
        move = self.status(move_id)
        if move.state != "running":
            raise NotInFlight(f"move {move_id!r} is {move.state}, not running", reference=move_id)
        move.state, move.finished_at = "cancelled", now
        move.pending_groups.clear()
        return move

    def step(self, now: float) -> None:
        """Advance every running move by at most MOVE_CHUNK messages."""
        state = self.state
        for move in state.moves.values():
            if move.state != "running" or not move.pending_groups:
                continue
            src = state.queues.get(move.source)
            dst = state.queues.get(move.destination)
            if src is None or dst is None:
                move.state, move.error, move.finished_at = "failed", "queue deleted during the move", now
                continue
            budget = MOVE_CHUNK
            while move.pending_groups and budget > 0:
                name = move.pending_groups.pop()
                group = src.groups.get(name)
                if group is None:
                    continue
                if group.claimed:  # in flight: moved when its claim ends (claim_ended re-adds it)
                    continue
                batch = prefix(group.messages, move.limit_key + 1)
                state.transfer(src, dst, batch, origin=None)
                move.moved += len(batch)
                move.remaining = max(0, move.remaining - len(batch))
                budget -= max(1, len(batch))
            if not move.pending_groups:
                left = sum(1 for m in src.by_id.values() if m.key <= move.limit_key)
                move.remaining = left
                if left == 0:
                    move.state, move.finished_at = "done", now
