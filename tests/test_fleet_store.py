"""The store keeps the fleet's pending controls and rebalancing policies (docs/fleet.md): rows written
through the group commit come back on the next open, and an older store without the fleet's tables gets
them on open (an idempotent migration, like the `request_id` column's)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from queue_core.machine.effects import FleetControlSaved, FleetPolicySaved
from queue_core.store import SqliteStore

ROW = {"id": "3-1", "worker": "w1", "kind": "sleep", "args": {}, "issued_at": 1.0, "expires_at": 9.0}


def test_fleet_rows_survive_a_reopen_and_old_stores_get_the_tables(tmp_path: Path) -> None:
    path = tmp_path / "queue.sqlite3"
    store = SqliteStore(path)
    store.open(1.0)
    store.close()
    with sqlite3.connect(path) as db:  # a store from before the fleet
        db.execute("DROP TABLE fleet_controls")
        db.execute("DROP TABLE fleet_policies")
    store = SqliteStore(path)
    store.open(2.0)
    assert store.control.fleet_controls == {} and store.control.fleet_policies == {}
    store.apply(
        [
            FleetControlSaved("3-1", ROW),
            FleetControlSaved("3-2", {**ROW, "id": "3-2"}),
            FleetControlSaved("3-2", None),  # acknowledged
            FleetPolicySaved("t1.jobs", {"min_active": 2}),
        ]
    )
    store.close()
    for _ in range(2):  # and opening twice changes nothing
        store = SqliteStore(path)
        store.open(3.0)
        assert store.control.fleet_controls == {"3-1": ROW}
        assert store.control.fleet_policies == {"t1.jobs": {"min_active": 2}}
        store.close()
