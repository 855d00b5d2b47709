"""examples/redis_lock.py, run for real: a Redis lock with INCR tokens, a holder frozen past
its TTL (SIGSTOP), a new holder that claims the scope and writes, the old one refused."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "redis_lock.py"


def _run(url, redis_url, lock, key, value, *extra):
    return subprocess.Popen([sys.executable, str(EXAMPLE), url, lock, key, value,
                             "--redis-url", redis_url, *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_redis_lock_example(url, redis_url, client, name):
    lock = f"{name}-redis"
    # A takes the lock (TTL 500 ms), claims the scope, and gets frozen while "working"
    a = _run(url, redis_url, lock, f"{name}/a-key", '{"by": "A"}', "--ttl-ms", "500",
             "--work-seconds", "1.5", "--owner", "A")
    line = a.stdout.readline()
    assert line.startswith("token="), (line, a.stderr.read() if a.poll() is not None else "")
    token_a = int(line.split("=")[1])
    os.kill(a.pid, signal.SIGSTOP)
    try:
        time.sleep(0.8)  # past A's TTL in Redis
        b = _run(url, redis_url, lock, f"{name}/b-key", '{"by": "B"}', "--ttl-ms", "5000",
                 "--owner", "B")
        out_b, err_b = b.communicate(timeout=30)
        assert b.returncode == 0, (out_b, err_b)
        token_b = int(out_b.splitlines()[0].split("=")[1])
        assert token_b == token_a + 1
    finally:
        os.kill(a.pid, signal.SIGCONT)
    out_a, err_a = a.communicate(timeout=30)
    # A writes a key B never touched: refused anyway, since B claimed the scope
    assert a.returncode == 3, (out_a, err_a)
    assert "status=412" in out_a and f"token {token_a} is stale" in err_a
    assert client.get(f"{name}/b-key").value == {"by": "B"}
    assert client.get_fence(lock).fence_token == token_b
    import fencegate
    try:
        client.get(f"{name}/a-key")
        raise AssertionError("the zombie's write landed")
    except fencegate.NotFound:
        pass

    # held: exit 2, nothing written
    import redis
    r = redis.Redis.from_url(redis_url)
    r.set(f"fencegate:lock:{lock}", "someone", px=5000)
    c = _run(url, redis_url, lock, f"{name}/c-key", "1")
    out_c, err_c = c.communicate(timeout=30)
    assert c.returncode == 2 and "held by 'someone'" in err_c, (out_c, err_c)
