"""Fixtures: the fencegate under test (FENCEGATE_URL), servers of our own with other
configurations (FENCEGATE_BIN, on DATABASE_URL when set, else SQLite in a temp dir), and Redis.

Nothing here skips: a missing dependency or setting fails the run and says what to install."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Dict, Iterator, List, Optional

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent  # clients/python


def _need(module: str, install: str) -> None:
    try:
        __import__(module)
    except ImportError as e:
        raise pytest.UsageError(
            f"the fencegate Python tests need {module!r} ({e}): {install}"
        ) from e


def pytest_configure(config: pytest.Config) -> None:
    _need("httpx", "pip install -e 'clients/python[ed25519]'")
    _need("fencegate", "pip install -e 'clients/python[ed25519]'")
    _need("cryptography", "pip install -e 'clients/python[ed25519]' (the ed25519 extra)")
    _need("redis", "pip install redis")
    if not os.environ.get("FENCEGATE_URL"):
        raise pytest.UsageError(
            "set FENCEGATE_URL to a running fencegate (e.g. FENCEGATE_URL=http://127.0.0.1:8080), "
            "and FENCEGATE_BIN to its binary; or run clients/python/test.sh"
        )


@pytest.fixture(scope="session")
def url() -> str:
    return os.environ["FENCEGATE_URL"].rstrip("/")


@pytest.fixture
def client(url: str):
    import fencegate
    with fencegate.Client(url, api_key=os.environ.get("FENCEGATE_API_KEY") or None) as c:
        yield c


RUN = uuid.uuid4().hex[:10]


@pytest.fixture
def name(request: pytest.FixtureRequest) -> str:
    """A name no other test or run uses (keys, scopes and locks live for ever in fencegate)."""
    return f"py-{RUN}-{request.node.name}"[:200].replace("[", "-").replace("]", "")


# -- our own fencegate processes ---------------------------------------------------------------

@pytest.fixture(scope="session")
def fencegate_bin() -> str:
    b = os.environ.get("FENCEGATE_BIN") or shutil.which("fencegate")
    if not b or not os.access(b, os.X_OK):
        pytest.fail(
            "these tests start fencegate servers of their own: set FENCEGATE_BIN to the fencegate "
            "binary (e.g. FENCEGATE_BIN=target/release/fencegate)", pytrace=False)
    return b


class Server:
    def __init__(self, proc: subprocess.Popen, url: str, workdir: str) -> None:
        self.proc = proc
        self.url = url
        self.workdir = workdir

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def start_server(binary: str, config: str, *, env: Optional[Dict[str, str]] = None,
                 sqlite: bool = False) -> Server:
    """Start `fencegate serve` with this config on a free port. On DATABASE_URL when set (and
    sqlite is false), else on a SQLite file in a fresh temp dir."""
    workdir = tempfile.mkdtemp(prefix="fg-py-")
    cfg = Path(workdir) / "fencegate.toml"
    cfg.write_text(config)
    e = dict(os.environ)
    e.pop("FENCEGATE_CONFIG", None)
    e.pop("FENCEGATE_LISTEN", None)
    if sqlite:
        e.pop("DATABASE_URL", None)
    e.update(env or {})
    stderr = open(Path(workdir) / "stderr.log", "wb")
    proc = subprocess.Popen([binary, "serve", "--listen", "127.0.0.1:0", "--config", str(cfg)],
                            cwd=workdir, env=e, stdout=subprocess.PIPE, stderr=stderr)
    line: List[bytes] = []

    def read() -> None:
        assert proc.stdout is not None
        line.append(proc.stdout.readline())

    t = threading.Thread(target=read, daemon=True)
    t.start()
    t.join(30)
    if not line or not line[0].startswith(b"listening on "):
        proc.kill()
        proc.wait()
        log = (Path(workdir) / "stderr.log").read_text(errors="replace")[-3000:]
        pytest.fail(f"fencegate did not start (config in {cfg}):\n{line}\n{log}", pytrace=False)
    addr = line[0].decode().split("listening on ", 1)[1].strip()
    return Server(proc, f"http://{addr}", workdir)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    exe = shutil.which("redis-server")
    if exe is None:
        pytest.fail("the Redis example test needs redis-server (Debian: apt-get install redis-server)",
                    pytrace=False)
    d = tempfile.mkdtemp(prefix="fg-py-redis-")
    port = free_port()
    proc = subprocess.Popen([exe, "--port", str(port), "--bind", "127.0.0.1", "--dir", d,
                             "--save", "", "--appendonly", "no"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    import redis
    r = redis.Redis(host="127.0.0.1", port=port)
    deadline = time.monotonic() + 10
    while True:
        try:
            r.ping()
            break
        except redis.ConnectionError:
            if time.monotonic() > deadline or proc.poll() is not None:
                proc.kill()
                pytest.fail("redis-server did not start", pytrace=False)
            time.sleep(0.05)
    yield f"redis://127.0.0.1:{port}/0"
    proc.terminate()
    proc.wait(10)
