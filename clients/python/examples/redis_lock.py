"""Bring your own lock: a Redis lock (redis-py) whose fencing token is minted with INCR, and
writes through fencegate under the lock's scope.

    python examples/redis_lock.py FENCEGATE_URL LOCK KEY VALUE [--ttl-ms 10000]
        [--work-seconds 0] [--owner HOST:PID] [--redis-url redis://127.0.0.1:6379/0]

Takes LOCK in Redis, claims the scope LOCK in fencegate with the new token (so every earlier
holder is fenced at once, even on keys this holder never writes), "works" for --work-seconds,
then writes VALUE (JSON text) to KEY under the scope LOCK, and releases the lock.

Prints token=N, then status=NNN. Exit status: 0 written; 3 refused as stale (a newer holder
exists: fencegate said 412); 2 the lock is held by someone else (nothing written); 1 any other
error. FENCEGATE_API_KEY, when set, is sent as the bearer credential.

How the token works: one Lua script runs SET <lock> OWNER NX PX TTL and, only if that took the
lock, INCR <lock>:fence. Redis runs a script as one unit, so every acquisition increments the
counter exactly once and a later holder always has a larger token. The counter never expires
and is never deleted. Use one Redis node with persistence (appendonly yes): a failover to an
async replica can lose increments; fencegate then keeps the higher fence and refuses with 412
rather than letting an old token overwrite newer data (raise the counter above
GET /v1/fences/LOCK to recover).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
from typing import Any, Optional

import redis

import fencegate

ACQUIRE = """
if redis.call("SET", KEYS[1], ARGV[1], "NX", "PX", ARGV[2]) then
  return redis.call("INCR", KEYS[2])
end
return 0
"""

RELEASE = """
if redis.call("GET", KEYS[1]) == ARGV[1] then
  return redis.call("DEL", KEYS[1])
end
return 0
"""


class RedisFencedLock:
    """A Redis lock whose holder writes through fencegate with the lock's token and scope."""

    def __init__(self, r: "redis.Redis[Any]", fg: fencegate.Client, name: str, *, ttl_ms: int,
                 owner: str, prefix: str = "fencegate:lock:") -> None:
        self.redis, self.fg, self.name = r, fg, name
        self.ttl_ms, self.owner = ttl_ms, owner
        self.lock_key = f"{prefix}{name}"
        self.fence_key = f"{prefix}{name}:fence"
        self.token: Optional[int] = None

    def acquire(self) -> int:
        """Take the lock and mint its token; claim the scope so older holders are fenced now.
        Raises ``LockHeldInRedis`` if someone else holds it."""
        token = int(self.redis.eval(ACQUIRE, 2, self.lock_key, self.fence_key, self.owner,
                                    self.ttl_ms))
        if token == 0:  # INCR never returns 0
            holder = self.redis.get(self.lock_key)
            raise LockHeldInRedis(self.name, holder.decode() if holder else None,
                                  self.redis.pttl(self.lock_key))
        self.token = token
        self.fg.claim(self.name, token=token)
        return token

    def put(self, key: str, value: Any) -> fencegate.WriteResult:
        assert self.token is not None, "acquire() first"
        return self.fg.put(key, value, token=self.token, scope=self.name)

    def delete(self, key: str) -> fencegate.DeleteResult:
        assert self.token is not None, "acquire() first"
        return self.fg.delete(key, token=self.token, scope=self.name)

    def release(self) -> None:
        """Release only our own lock: after a stall, the key may be the next holder's."""
        self.redis.eval(RELEASE, 1, self.lock_key, self.owner)

    def __enter__(self) -> "RedisFencedLock":
        self.acquire()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()


class LockHeldInRedis(Exception):
    def __init__(self, name: str, holder: Optional[str], remaining_ms: int) -> None:
        super().__init__(f"lock {name!r} is held by {holder!r} for another {remaining_ms} ms")
        self.holder, self.remaining_ms = holder, remaining_ms


def main(argv: Optional[list] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("url")
    p.add_argument("lock")
    p.add_argument("key")
    p.add_argument("value", help="JSON text")
    p.add_argument("--ttl-ms", type=int, default=10_000)
    p.add_argument("--work-seconds", type=float, default=0.0)
    p.add_argument("--owner", default=f"{socket.gethostname()}:{os.getpid()}")
    p.add_argument("--redis-url", default=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"))
    a = p.parse_args(argv)
    value = json.loads(a.value)

    r = redis.Redis.from_url(a.redis_url)
    with fencegate.Client(a.url, api_key=os.environ.get("FENCEGATE_API_KEY") or None) as fg:
        lock = RedisFencedLock(r, fg, a.lock, ttl_ms=a.ttl_ms, owner=a.owner)
        try:
            lock.acquire()
        except LockHeldInRedis as e:
            print(f"redis_lock: {e}", file=sys.stderr)
            return 2
        except fencegate.StaleToken as e:
            # the scope's fence is above Redis's counter (Redis lost increments)
            print(f"redis_lock: the claim was refused: {e}", file=sys.stderr)
            return 3
        try:
            print(f"token={lock.token}", flush=True)
            time.sleep(a.work_seconds)  # the work (a GC pause here makes a zombie)
            try:
                lock.put(a.key, value)
                print("status=200", flush=True)
                return 0
            except fencegate.StaleToken as e:
                print("status=412", flush=True)
                print(f"redis_lock: token {e.presented} is stale, the fence of {e.scope!r} is "
                      f"{e.current}: a newer holder exists", file=sys.stderr)
                return 3
            except fencegate.FencegateError as e:
                print(f"status={e.status}", flush=True)
                print(f"redis_lock: {e}", file=sys.stderr)
                return 1
        finally:
            lock.release()


if __name__ == "__main__":
    sys.exit(main())
