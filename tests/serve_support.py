"""A real `strictq serve` process for the security tests of logs and connections: stderr in a file."""

from __future__ import annotations

import json
import os
import queue
import ssl
import subprocess
import sys
import tomllib
import urllib.request
from pathlib import Path
from typing import Any

from conftest import ROOT, ChildProcess

START_TIMEOUT = 30.0


class Serve(ChildProcess):
    def __init__(self, data_dir: Path, proc: subprocess.Popen[bytes], log_path: Path) -> None:
        super().__init__(proc, log_path)
        self.data_dir = data_dir
        self.url = ""
        self.ca: Path | None = None

    def secret(self, role: str) -> str:
        keys = tomllib.loads((self.data_dir / "keys.toml").read_text())
        return str(next(c for c in keys["credential"] if c["role"] == role)["secret"])

    def address(self) -> tuple[str, int]:
        host, port = self.url.split("//", 1)[1].rsplit(":", 1)
        return host, int(port)

    def full_log(self) -> str:
        return self.log_path.read_text(errors="replace")

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


def start_serve(data_dir: Path, *extra: str, tls: bool = False) -> Serve:
    """`strictq serve` on a free loopback port without the egress proxy; waits for its start-up lines."""
    data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    log_path = data_dir.parent / f"{data_dir.name}.serve.log"
    command = [sys.executable, "-m", "strictq", "serve", "--port", "0", "--data-dir", str(data_dir)]
    command.append("--no-proxy")
    if not tls:
        command.append("--insecure-http")
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            [*command, *extra],
            cwd=ROOT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=log,
        )
    serve = Serve(data_dir, proc, log_path)
    while True:
        try:
            line = serve.stdout.get(timeout=START_TIMEOUT)
        except queue.Empty:
            line = None
        if line is None:
            serve.kill()
            raise RuntimeError(f"strictq serve did not start; log:\n{serve.log()}")
        if line.startswith("strictq: listening on "):
            serve.url = line.split()[-1]
        elif line.startswith("strictq: ca "):
            serve.ca = Path(line[len("strictq: ca ") :].strip())
        elif line.startswith("strictq: client env "):
            return serve


def stop(serve: Serve) -> None:
    try:
        serve.terminate()
    finally:
        if serve.running():
            serve.kill()
