"""A real `strictq serve` process for the security tests of logs and connections: stderr in a file."""

from __future__ import annotations

import json
import ssl
import tomllib
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kit.process import CA, CLIENT_ENV, LISTENING, ChildProcess, launch, strictq


class Serve(ChildProcess):
    data_dir: Path
    url: str
    ca: Path | None

    def secret(self, role: str) -> str:
        keys = tomllib.loads((self.data_dir / "keys.toml").read_text())
        return str(next(c for c in keys["credential"] if c["role"] == role)["secret"])

    def address(self) -> tuple[str, int]:
        host, port = self.url.split("//", 1)[1].rsplit(":", 1)
        return host, int(port)

    def ssl_context(self) -> ssl.SSLContext | None:
        return ssl.create_default_context(cafile=str(self.ca)) if self.ca is not None else None

    def call(self, method: str, path: str, key: str, body: Any = None) -> tuple[int, Any]:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.url + path, data=data, method=method)
        request.add_header("X-BV-API-Key", key)
        if data is not None:
            request.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(request, timeout=30, context=self.ssl_context()) as answer:
                return answer.status, json.loads(answer.read() or b"null")
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read() or b"null")


def start_serve(
    data_dir: Path, *extra: str, tls: bool = False, env: Mapping[str, str] | None = None
) -> Serve:
    """`strictq serve` on a free loopback port without the egress proxy; waits for its start-up lines.
    `env`: more environment (e.g. a short wire-log segment age)."""
    data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    command = strictq("serve", "--port", "0", "--data-dir", str(data_dir), "--no-proxy")
    if not tls:
        command.append("--insecure-http")
    log_path = data_dir.parent / f"{data_dir.name}.serve.log"
    serve = launch([*command, *extra], log_path, wait_for=[LISTENING, CLIENT_ENV], make=Serve, env=env)
    serve.data_dir = data_dir
    serve.url = serve.startup[LISTENING].split()[-1]
    ca = serve.value(CA)
    serve.ca = Path(ca) if ca is not None else None
    return serve


def stop(serve: Serve) -> None:
    serve.stop()
