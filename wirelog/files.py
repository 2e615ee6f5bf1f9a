"""Private files: every file the servers write is created with its final mode, and start-up faults name
the file and what to do.

Why here: wirelog is the bottom layer (every package imports it, it imports none of them), so the
gateway, the core, the proxy and the Spark jobs share one way of writing files. Secrets and message
bodies are never visible to other users, not even for the instant between a write and a chmod: the mode
is given to `os.open` (O_EXCL, a fresh temporary name) and the file is renamed into place. The umask can
only make a mode tighter, never looser.

`check_modes` reports files an earlier version (or an operator) left with looser modes; the servers log
each as one WARNING line at start, naming the file and the `chmod` to run. Nothing is changed behind the
operator's back.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from wirelog.layout import fsync_dir, parse_segment_name

PRIVATE_DIR = 0o700  # the data dir and its subdirectories
PRIVATE_FILE = 0o600  # secrets, the store, state files
PUBLIC_FILE = 0o644  # certificates and CA bundles: meant to be handed out
SEGMENT_FILE = 0o640  # wire-log segments (wirelog.writer.FILE_MODE): redacted traffic, group may read

# Files in a data dir that must be 0600, by name (anywhere under it).
SECRET_NAMES = frozenset(
    {
        "keys.toml",
        "client.env",
        "redaction.key",
        "receipt.key",  # the gateway's receipt-handle key
        "internal.secret",  # the internal API's shared secret (queue_core.internal_auth)
        "fences.json",
        "suspended.json",
        "queue.sqlite3",
        "queue.sqlite3-wal",
        "queue.sqlite3-shm",
        "queue.sqlite3-journal",
        "mitmproxy-ca.pem",  # the proxy CA's private key (fencing.ca)
        "mitmproxy-ca.p12",
    }
)
SECRET_SUFFIXES = ("-key.pem",)  # TLS private keys (gateway.tls)
STATE_DIRS = ("", "queue", "tls", "proxy", "proxy/ca")  # where SECRET_NAMES are looked for
SEGMENT_DIRS = ("wirelog", "proxy/wirelog")


class StartupError(Exception):
    """A file or directory a server needs at start is missing, malformed or not accessible.

    Rendered in one place (strictq.cli) as one line, `strictq: <path>: <problem>; <what to do>`, with exit
    code 2 and no traceback: the operator's next step, not a stack."""

    def __init__(self, path: Path | str, problem: str, action: str) -> None:
        self.path = Path(path)
        self.problem = problem
        self.action = action
        super().__init__(f"{self.path}: {problem}; {action}")


# ---------------------------------------------------------------------------------------- creating
def private_dir(path: Path | str) -> Path:
    """Create `path` (and missing parents) as 0700; an existing directory is left as it is (`check_modes`
    reports a looser one). Returns the path."""
    path = Path(path)
    if not path.is_dir():
        path.parent.mkdir(parents=True, exist_ok=True)  # parents: the operator's (e.g. var/)
        try:
            path.mkdir(mode=PRIVATE_DIR)
        except FileExistsError:
            if not path.is_dir():
                raise
    return path


def restrict_umask(mask: int = 0o027) -> int:
    """Tighten (never loosen) this process's umask by `mask`; returns the previous one.

    For the offline tools that write wire-log data through libraries whose file modes we do not choose
    (the Spark index, written by the JVM, which inherits the umask; replay reports): with 0o027 their
    files are at most 0640 and their directories 0750, like the wire-log segments they derive from."""
    previous = os.umask(0)
    os.umask(previous | mask)
    return previous


def write_file(path: Path | str, data: bytes | str, mode: int, *, sync: bool = True) -> Path:
    """Replace `path` atomically with `data`, the file created with `mode` (never chmod after writing).

    Written under a fresh temporary name (O_EXCL: never an existing file with another mode), fsynced,
    renamed into place, and the directory fsynced: a crash leaves the old file or the new one, never a
    torn or half-private one."""
    path = Path(path)
    raw = data.encode() if isinstance(data, str) else bytes(data)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode)
    try:
        try:
            view = memoryview(raw)
            while view:
                view = view[os.write(fd, view) :]
            if sync:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if sync:
        fsync_dir(path.parent)
    return path


def write_private(
    path: Path | str, data: bytes | str, mode: int = PRIVATE_FILE, *, sync: bool = True
) -> Path:
    """`write_file` for secrets and state: 0600 unless told otherwise."""
    return write_file(path, data, mode, sync=sync)


def open_private(path: Path | str, mode: int = PRIVATE_FILE) -> BinaryIO:
    """Open `path` for appending (created with `mode` if missing), e.g. a log file beside the state."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, mode)
    return os.fdopen(fd, "ab")


def create_private(path: Path | str, mode: int = PRIVATE_FILE) -> bool:
    """Create `path` empty with `mode` if it does not exist (e.g. before SQLite opens it: SQLite gives its
    -wal and -shm files the main file's mode). True if this call created it."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode)
    except FileExistsError:
        return False
    os.close(fd)
    return True


def check_writable(directory: Path | str) -> None:
    """Raise StartupError unless a file can be created in `directory` (a read-only mount, a directory of
    another user): found at start, not at the first write."""
    directory = Path(directory)
    probe = directory / f".strictq-write-check.{os.getpid()}"
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, PRIVATE_FILE)
        os.close(fd)
        probe.unlink()
    except OSError as exc:
        raise StartupError(
            directory,
            f"cannot write in this directory ({exc.strerror or exc})",
            "make it writable by this user (chown/chmod, a read-write mount) or choose another --data-dir",
        ) from None


@contextlib.contextmanager
def file_faults(default: Path | str) -> Iterator[None]:
    """Around start-up steps that read or write files: an OSError becomes a StartupError naming its file
    (`default` when the error names none)."""
    try:
        yield
    except OSError as exc:
        raise StartupError(
            exc.filename if exc.filename is not None else default,
            f"cannot use it ({exc.strerror or exc})",
            "check that this user can read and write it and its directory (permissions, a read-write "
            "mount, free space)",
        ) from None


# ---------------------------------------------------------------------------------------- checking
def check_modes(data_dir: Path | str) -> list[str]:
    """Warnings (one line each, naming the file and the chmod to run) about group/other access to the
    data dir, its secrets and store files, and about wire-log segments beyond 0640."""
    root = Path(data_dir)
    warnings: list[str] = []
    mode = _mode(root)
    if mode is not None and mode & 0o077:
        warnings.append(_line(root, mode, "the data dir", PRIVATE_DIR))
    for path in _state_files(root):
        mode = _mode(path)
        if mode is not None and mode & 0o077:
            warnings.append(_line(path, mode, "a secret or store file", PRIVATE_FILE))
    for path in _segments(root):
        mode = _mode(path)
        if mode is not None and mode & 0o027:
            warnings.append(_line(path, mode, "a wire-log segment", SEGMENT_FILE))
    return warnings


def _line(path: Path, mode: int, what: str, wanted: int) -> str:
    who = "other users" if mode & 0o007 else "the group"
    return f"{path} ({what}) is mode {mode:04o}, open to {who}; run: chmod {wanted:o} {path}"


def _mode(path: Path) -> int | None:
    try:
        st = path.lstat()
    except OSError:
        return None
    if stat.S_ISLNK(st.st_mode):
        return None  # the target is someone else's to check
    return stat.S_IMODE(st.st_mode)


def _state_files(root: Path) -> Iterator[Path]:
    for sub in STATE_DIRS:
        directory = root / sub if sub else root
        try:
            entries = sorted(os.scandir(directory), key=lambda e: e.name)
        except OSError:
            continue
        for entry in entries:
            if entry.name in SECRET_NAMES or entry.name.endswith(SECRET_SUFFIXES):
                if entry.is_file(follow_symlinks=False):
                    yield Path(entry.path)


def _segments(root: Path) -> Iterator[Path]:
    for sub in SEGMENT_DIRS:
        try:
            entries = sorted(os.scandir(root / sub), key=lambda e: e.name)
        except OSError:
            continue
        for entry in entries:
            if parse_segment_name(entry.name) is not None and entry.is_file(follow_symlinks=False):
                yield Path(entry.path)
