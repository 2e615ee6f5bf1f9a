"""Start-up checks of a server's data dir, shared by `strictq serve` and `strictq queue-server`.

Everything that can be found wrong with the files before the server listens is found here, first, and
raised as a `StartupError` naming the file and what to do (rendered as one line, exit code 2, by
strictq.cli): a data dir that cannot be written, a damaged store, fences.json or suspended.json. And a
store that is missing or empty although the data dir shows that a store was there (a marker written once
it first opened, development keys, fences, wire-log segments, ...): starting would silently serve an
empty queue, so it is refused unless `--init` says to start empty.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import time
from pathlib import Path

from access.keys import KeyFileError, KeyRing
from wirelog.files import StartupError, check_modes, check_writable, private_dir, write_private
from wirelog.layout import parse_segment_name
from wirelog.writer import DIR_MODE as WIRELOG_DIR_MODE

from .failures import read_suspensions
from .fences import FenceRegistry
from .service import QueueService
from .store import store_fault

log = logging.getLogger("strictq.startup")

STORE_FILE = "queue.sqlite3"  # QueueService's store, in the directory it is given
MARKER = ".strictq-store"  # in the data dir: a store was created here (its absence is then data loss)
DEV_KEYS_HEADER = "# strictq development credentials"  # gateway.keys.write_development_keys's first line
STATE_FILES = (
    "fences.json",
    "suspended.json",
    "client.env",
    "redaction.key",
    "receipt.key",
    "tls/ca-key.pem",
)


def prepare_data_dir(data_dir: Path) -> None:
    """Create the data dir 0700 (an existing one is kept as it is) and make sure it can be written."""
    try:
        private_dir(data_dir)
    except OSError as exc:
        raise StartupError(
            data_dir,
            f"cannot create the data dir ({exc.strerror or exc})",
            "create it writable by this user, or choose another --data-dir",
        ) from None
    check_writable(data_dir)


def warn_loose_modes(data_dir: Path) -> None:
    """One WARNING per file an earlier version or an operator left open to other users (after the fault
    checks: a refused start prints only its fault)."""
    for line in check_modes(data_dir):
        log.warning("%s", line)


def load_keys(path: Path) -> KeyRing:
    """The key file, its faults naming it (KeyFileError names the entry, not always the file)."""
    try:
        return KeyRing.load(path)
    except KeyFileError as exc:
        raise StartupError(path, str(exc), "fix it (schema in the README) or give another --keys") from None


def earlier_state(data_dir: Path) -> list[str]:
    """What in `data_dir` shows that a server ran here before (relative names; empty: a new data dir)."""
    found: list[str] = []
    if (data_dir / MARKER).exists():
        found.append(MARKER)
    keys = data_dir / "keys.toml"
    try:
        with keys.open("rb") as handle:  # an operator's own key file says nothing about a store
            if handle.read(len(DEV_KEYS_HEADER)) == DEV_KEYS_HEADER.encode():
                found.append("keys.toml")
    except OSError:
        pass
    found += [name for name in STATE_FILES if (data_dir / name).exists()]
    try:
        if any(parse_segment_name(name) for name in os.listdir(data_dir / "wirelog")):
            found.append("wirelog/")
    except OSError:
        pass
    return found


def check_store(data_dir: Path, store_dir: Path, init: bool) -> None:
    """Refuse a missing, zero-length or schema-less (`holds_store`) store in a data dir with state of an
    earlier run, unless `init`; with `init`, clear it (moving a leftover -wal file, and a non-empty file,
    aside) so it starts empty."""
    store = store_dir / STORE_FILE
    try:
        size: int | None = store.stat().st_size
    except FileNotFoundError:
        size = None
    except OSError as exc:
        raise store_fault(store, exc) from None
    if size and holds_store(store):
        return  # a damaged one is found when it is opened
    state = earlier_state(data_dir)
    if not state:
        return  # a new data dir (or an empty file and nothing else): start empty
    if size is None:
        what = "missing"
    else:
        what = "an SQLite file without a strictq store in it" if size else "empty (0 bytes)"
    if not init:
        raise StartupError(
            store,
            f"the store is {what}, but {data_dir} holds state of an earlier run ({', '.join(state)}): "
            "starting would serve an empty queue",
            "restore the store from a backup, or pass --init to start with an empty store",
        )
    log.warning("--init: starting with an empty store at %s (it was %s)", store, what)
    stamp = time.strftime("%Y%m%dT%H%M%S")
    for suffix in ("-wal", "-journal"):  # never replay an old log into the new store; keep it though
        leftover = store.with_name(store.name + suffix)
        if leftover.exists():
            aside = leftover.with_name(f"{leftover.name}.before-init-{stamp}")
            leftover.rename(aside)
            log.warning("--init: moved %s aside to %s", leftover, aside)
    store.with_name(store.name + "-shm").unlink(missing_ok=True)  # an index of the -wal, rebuilt
    if size:  # an SQLite file of something else: kept, as the -wal is
        aside = store.with_name(f"{store.name}.before-init-{stamp}")
        store.rename(aside)
        log.warning("--init: moved %s aside to %s", store, aside)
    store.unlink(missing_ok=True)


def holds_store(store: Path) -> bool:
    """Whether the non-empty file `store` holds a strictq store (its `meta` table with an epoch, read with
    its -wal), not just any SQLite file: a valid but empty database (4096 bytes, no tables) would start as
    an empty store, epoch 1, as silently as a zero-length one. True when it cannot be told here (not
    SQLite, locked, unreadable): opening it reports that."""
    try:
        db = sqlite3.connect(f"{store.resolve().as_uri()}?mode=rw", uri=True, timeout=1.0)
    except sqlite3.Error:
        return True
    try:
        tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if "meta" not in tables:
            return False
        return db.execute("SELECT 1 FROM meta WHERE name = 'epoch'").fetchone() is not None
    except sqlite3.Error:
        return True
    finally:
        db.close()


def check_state_files(data_dir: Path, health: bool) -> None:
    """fences.json (and suspended.json with failure management on) must be readable and well-formed;
    with failure management on, its events go to the wire-log directory, which must be writable."""
    FenceRegistry(data_dir / "fences.json").load()
    if health:
        read_suspensions(data_dir / "suspended.json")
        check_wirelog_dir(data_dir / "wirelog")


def check_wirelog_dir(directory: Path) -> None:
    """The wire-log directory must be a directory this user can write in (created 0750 if missing):
    found at start, not as an ERROR with a traceback per record once clients are served."""
    try:
        directory.mkdir(mode=WIRELOG_DIR_MODE, parents=True, exist_ok=True)
    except FileExistsError:
        raise StartupError(
            directory,
            "is not a directory (the wire log is written into it)",
            "move the file aside so a directory can be made there",
        ) from None
    except OSError as exc:
        raise StartupError(
            directory,
            f"cannot create the wire-log directory ({exc.strerror or exc})",
            "make its parent writable by this user",
        ) from None
    check_writable(directory)


def check_output_file(path: Path) -> None:
    """A file the server (re)writes after it listens (client.env): refuse a directory or other non-file
    in its place now, not with a traceback once the server is up."""
    if path.is_dir() and not path.is_symlink():  # a file, link or nothing is replaced by the rename
        raise StartupError(
            path,
            "is a directory (the server writes this file at every start)",
            "move it aside so the server can write the file there",
        )


async def start_service(service: QueueService, data_dir: Path) -> None:
    """Open and restore the store (faults found while restoring rows become StartupErrors too), then
    record that this data dir has a store."""
    store = service.data_dir / STORE_FILE
    try:
        await service.start()
    except (sqlite3.Error, OSError) as exc:
        raise store_fault(store, exc) from None
    mark_store(data_dir, store)


def mark_store(data_dir: Path, store: Path) -> None:
    """Write the marker (once): from now on a missing or empty store here is refused without --init."""
    marker = data_dir / MARKER
    if not marker.exists():
        write_private(
            marker,
            f"{os.path.relpath(store, data_dir)}\nA strictq store was created in this data dir. If it is "
            "missing or empty, the server refuses to start (its messages would be gone); --init starts "
            "it empty.\n",
        )


def listen_fault(host: str, port: int, exc: OSError) -> StartupError:
    """The listening socket cannot be bound (port in use, an address this host does not have)."""
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    return StartupError(
        address,
        f"cannot listen ({exc.strerror or exc})",
        "stop the process using it, or choose another --host/--port",
    )
