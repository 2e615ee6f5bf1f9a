"""The layers (README's architecture): the import graph of our packages has no cycle, the import-linter
contracts of pyproject.toml hold (and catch an upward import), and each shared rule has one copy: the
tenancy rule in access.tenancy, the header names in protocol.headers."""

from __future__ import annotations

import ast
import subprocess
import sys
import tomllib
from pathlib import Path

import grimp
import pytest

from access import permissions, tenancy
from access.keys import Credential
from gateway.emodb import DEDUP_FACE, QUEUE_FACE
from protocol import headers

ROOT = Path(__file__).resolve().parent.parent
CONFIG = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
PACKAGES: list[str] = CONFIG["root_packages"]


def cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """Every strongly connected component of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph.modules):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.find_modules_directly_imported_by(child)))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    return grimp.build_graph(*PACKAGES, cache_dir=None)


def test_the_import_graph_has_no_cycle(graph: grimp.ImportGraph) -> None:
    assert cycles(graph) == []


def test_the_cycle_finder_finds_a_cycle() -> None:
    made = grimp.ImportGraph()
    edges = [("p.a", "p.b"), ("p.b", "p.c"), ("p.c", "p.a"), ("p.c", "p.d"), ("p.e", "p.d")]
    for importer, imported in edges:
        made.add_import(importer=importer, imported=imported)
    assert cycles(made) == [["p.a", "p.b", "p.c"]]


def test_the_machine_imports_only_the_standard_library_protocol_and_the_tenancy_rule(
    graph: grimp.ImportGraph,
) -> None:
    """Sans-I/O: nothing of the shell around it (store, service, HTTP), nor the key file."""
    ours = {
        imported
        for module in graph.find_children("queue_core.machine") | {"queue_core.machine"}
        for imported in graph.find_modules_directly_imported_by(module)
        if not imported.startswith("queue_core.machine")
    }
    allowed = {"access.tenancy", "protocol.errors", "protocol.headers", "protocol.estimates", "protocol"}
    assert ours <= allowed, ours


def test_the_layer_contracts_are_kept() -> None:
    done = _lint_imports(ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "broken" in done.stdout and " 0 broken" in done.stdout


def test_the_layer_contracts_refuse_an_upward_and_a_sideways_import(tmp_path: Path) -> None:
    """The same contracts over a small tree of stand-in packages: clean, then with the core importing the
    gateway, the proxy importing the gateway, the CLI importing the scenarios above it: each is reported."""
    (tmp_path / "pyproject.toml").write_text(_importlinter_section())
    for package in PACKAGES:
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text("")
    (tmp_path / "queue_core" / "machine").mkdir()
    (tmp_path / "queue_core" / "machine" / "__init__.py").write_text("import access.tenancy\n")
    for contract in CONFIG["contracts"]:  # the modules a contract names must exist
        for module in [*contract.get("forbidden_modules", []), *contract.get("source_modules", [])]:
            if module.split(".")[0] in PACKAGES and "." in module:
                (tmp_path / (module.replace(".", "/") + ".py")).write_text("")
    (tmp_path / "access" / "tenancy.py").write_text("import protocol\n")
    (tmp_path / "gateway" / "app.py").write_text("import queue_core\nimport access\n")
    (tmp_path / "strictq" / "serve.py").write_text("import gateway.app\nimport fencing\nimport spark\n")
    (tmp_path / "strictq" / "cli.py").write_text("import strictq.serve\n")
    (tmp_path / "scenarios" / "demo.py").write_text("import strictq.cli\nimport strictq.serve\n")
    clean = _lint_imports(tmp_path)
    assert clean.returncode == 0, clean.stdout + clean.stderr

    (tmp_path / "queue_core" / "upward.py").write_text("import gateway.app\n")
    upward = _lint_imports(tmp_path)
    assert upward.returncode != 0
    assert "queue_core.upward -> gateway.app" in upward.stdout, upward.stdout

    (tmp_path / "queue_core" / "upward.py").unlink()
    (tmp_path / "fencing" / "auth.py").write_text("import gateway.app\n")
    sideways = _lint_imports(tmp_path)
    assert sideways.returncode != 0
    assert "fencing.auth -> gateway.app" in sideways.stdout, sideways.stdout

    (tmp_path / "fencing" / "auth.py").unlink()
    (tmp_path / "strictq" / "cli.py").write_text("import strictq.serve\nimport scenarios.demo\n")
    below = _lint_imports(tmp_path)
    assert below.returncode != 0
    assert "strictq.cli -> scenarios.demo" in below.stdout, below.stdout

    (tmp_path / "strictq" / "cli.py").write_text("import strictq.serve\n")
    (tmp_path / "queue_core" / "machine" / "core.py").write_text("import sqlite3\n")
    machine = _lint_imports(tmp_path)
    assert machine.returncode != 0
    assert "queue_core.machine.core -> sqlite3" in machine.stdout, machine.stdout


def _importlinter_section() -> str:
    """pyproject.toml's own [tool.importlinter] tables, verbatim."""
    text = (ROOT / "pyproject.toml").read_text()
    start = text.index("[tool.importlinter]")
    rest = text[start:]
    tables = ("tool.mypy", "tool.ruff", "tool.pytest")
    end = min((rest.index(f"\n[{t}") for t in tables if f"\n[{t}" in rest), default=len(rest))
    return rest[:end]


def _lint_imports(where: Path) -> subprocess.CompletedProcess[str]:
    """lint-imports in `where` (its pyproject.toml), its packages first on the path."""
    code = "import sys; from importlinter.cli import lint_imports; sys.exit(lint_imports(no_cache=True))"
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=where,
        env={"PYTHONPATH": str(where), "PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


# ------------------------------------------------------------------------------------ one copy of each rule
def _sources() -> list[Path]:
    return sorted(p for package in PACKAGES for p in (ROOT / package).rglob("*.py"))


def _string_constants(path: Path) -> list[tuple[int, str]]:
    """Every str and bytes literal of a module (bytes as Latin-1 text), with its line."""
    tree = ast.parse(path.read_text(), str(path))
    return [
        (node.lineno, node.value.decode("latin-1") if isinstance(node.value, bytes) else node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str | bytes) and node.value
    ]


def test_header_names_are_spelled_only_in_protocol_headers() -> None:
    """wirelog, the bottom layer, imports nothing of ours: its redaction defaults name secret headers of
    every kind (`x-bv-api-key` among `x-api-key`, `cookie`...) on their own."""
    names = {headers.API_KEY, headers.PROXY_ACTION, headers.CAPABILITIES, *headers.TAGS}
    lowered = {name.lower() for name in names}
    found = [
        f"{path.relative_to(ROOT)}:{line}: {value!r}"
        for path in _sources()
        if path != ROOT / "protocol" / "headers.py" and path != ROOT / "wirelog" / "redaction.py"
        for line, value in _string_constants(path)
        if value.lower() in lowered
    ]
    assert found == []


def test_the_dedup_namespace_is_spelled_only_in_the_tenancy_rule() -> None:
    """No `f"{tenant}_dedupq.{name}"` nor `"_dedupq"` outside access.tenancy (examples in messages such as
    `t1_dedupq.orders` are fine: they start with a tenant)."""
    found = [
        f"{path.relative_to(ROOT)}:{line}"
        for path in _sources()
        if path != ROOT / "access" / "tenancy.py"
        for line, value in _string_constants(path)
        if value.startswith("_dedupq")
    ]
    assert found == []


# ------------------------------------------------------------------------------------------ the tenancy rule
@pytest.mark.parametrize(
    ("queue", "tenant", "split"),
    [
        ("t1.orders", "t1", ("t1", "orders")),
        ("t1_dedupq.orders", "t1", ("t1_dedupq", "orders")),
        ("t1.a.b", "t1", ("t1", "a.b")),
        ("jobs", None, (None, "jobs")),
    ],
)
def test_core_names_split_into_tenant_and_name(
    queue: str, tenant: str | None, split: tuple[str | None, str]
) -> None:
    assert tenancy.tenant_of(queue) == tenant
    assert tenancy.split(queue) == split


def test_a_credential_sees_its_tenant_on_each_face_within_its_prefixes() -> None:
    worker = Credential("w-1234", "w" * 16, "worker", "t1", ("orders",))
    assert permissions.queue_name(worker, "orders-eu") == "t1.orders-eu"
    assert permissions.queue_name(worker, "orders-eu", "dedupq") == "t1_dedupq.orders-eu"
    assert permissions.queue_name(worker, "payments") is None  # outside its prefixes
    assert permissions.queue_name(worker, "bad/name") is None
    assert permissions.visible_name(worker, "t1.orders") == "orders"
    assert permissions.visible_name(worker, "t1_dedupq.orders") is None  # another face's namespace
    assert permissions.visible_name(worker, "t1_dedupq.orders", "dedupq") == "orders"
    assert permissions.visible_name(worker, "t2.orders") is None
    assert permissions.visible_name(worker, "orders") is None  # no tenant: not the credential's
    # The EmoDB faces go through the same rule.
    assert DEDUP_FACE.internal(worker, "orders") == "t1_dedupq.orders"
    assert QUEUE_FACE.visible(worker, "t1_dedupq.orders") is None
    assert DEDUP_FACE.visible(worker, "t1_dedupq.orders") == "orders"


def test_roles_grant_what_the_faces_and_admin_routes_need() -> None:
    def who(role: str) -> Credential:
        return Credential(f"{role}-1", role * 4 + "x" * 12, role, "t1")  # type: ignore[arg-type]

    assert [r for r in ("producer", "worker", "admin") if permissions.allowed(who(r), "send")] == [
        "producer",
        "admin",
    ]
    assert [r for r in ("producer", "worker", "admin") if permissions.allowed(who(r), "consume")] == [
        "worker",
        "admin",
    ]
    assert not permissions.allowed(who("operator"), "read")  # operators never touch data
    assert permissions.spans_tenants(who("operator")) and not permissions.spans_tenants(who("admin"))
    with pytest.raises(permissions.Forbidden, match="role producer"):
        permissions.require(who("producer"), permissions.allowed(who("producer"), "consume"), "poll")
