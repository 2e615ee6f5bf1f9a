"""`make lint` type-checks every package strictly: a new package cannot slip past mypy unnoticed.

Running mypy itself is `make lint`'s job (seconds, not a test); these tests guard its configuration.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
NOT_CHECKED = {"tests", "bench"}  # test and benchmark code: not held to --strict


def _mypy_config() -> dict[str, Any]:
    with open(ROOT / "pyproject.toml", "rb") as f:
        config: dict[str, Any] = tomllib.load(f)["tool"]["mypy"]
    return config


def _packages() -> set[str]:
    return {
        path.parent.name
        for path in ROOT.glob("*/__init__.py")
        if not path.parent.name.startswith(".") and path.parent.name not in NOT_CHECKED
    }


def test_every_package_is_checked() -> None:
    config = _mypy_config()
    packages = _packages()
    assert {"queue_core", "gateway", "fencing", "wirelog", "spark", "strictq"} <= packages
    assert set(config["files"]) == packages, "add the new package to [tool.mypy] files in pyproject.toml"


def test_checked_strictly_without_blanket_ignores() -> None:
    config = _mypy_config()
    assert config["strict"] is True
    ours = _packages()
    for override in config.get("overrides", []):
        modules = override["module"] if isinstance(override["module"], list) else [override["module"]]
        for module in modules:
            assert module.split(".")[0] not in ours, f"{module}: our own code gets no mypy override"
        assert "ignore_errors" not in override, "third-party modules are typed as Any, not silenced wholesale"
    for name in config.get("untyped_calls_exclude", []):
        assert name.split(".")[0] not in ours, f"{name}: our own functions must be annotated"
