"""The zombie: takes a lease, writes, waits for a line on stdin (the test freezes this process
with SIGSTOP meanwhile, past its lease), then writes again and reports what happened as JSON.

    python zombie_child.py URL LOCK KEY TTL_MS sync|async
"""

from __future__ import annotations

import asyncio
import json
import sys

import fencegate


def say(**kw: object) -> None:
    print(json.dumps(kw), flush=True)


def outcome(e: BaseException) -> dict:
    d: dict = {"error": type(e).__name__}
    if isinstance(e, fencegate.StaleToken):
        d.update(presented=e.presented, current=e.current, scope=e.scope)
    return d


def run_sync(url: str, lock: str, key: str, ttl_ms: int) -> None:
    with fencegate.Client(url) as client:
        with client.lease(lock, ttl_ms=ttl_ms, owner="zombie") as lease:
            lease.put(key, {"by": "zombie", "n": 1})
            say(ready=True, token=lease.token)
            sys.stdin.readline()  # frozen here by the test, then resumed
            try:
                lease.put(key, {"by": "zombie", "n": 2})
                late: dict = {"error": None}
            except (fencegate.StaleToken, fencegate.LeaseLost) as e:
                late = outcome(e)
            # Whatever the lease knew, the server must refuse the old token on its own:
            try:
                client.put(key, {"by": "zombie", "n": 3}, token=lease.token, scope=lease.scope)
                raw: dict = {"error": None}
            except fencegate.StaleToken as e:
                raw = outcome(e)
            say(late=late, raw=raw, lost=lease.lost.is_set(),
                lost_reason=type(lease.lost_reason).__name__, token=lease.token)
        say(exited=True)  # the release of a lost lease raised nothing


async def run_async(url: str, lock: str, key: str, ttl_ms: int) -> None:
    loop = asyncio.get_running_loop()
    async with fencegate.AsyncClient(url) as client:
        async with client.lease(lock, ttl_ms=ttl_ms, owner="zombie") as lease:
            await lease.put(key, {"by": "zombie", "n": 1})
            say(ready=True, token=lease.token)
            await loop.run_in_executor(None, sys.stdin.readline)
            try:
                await lease.put(key, {"by": "zombie", "n": 2})
                late: dict = {"error": None}
            except (fencegate.StaleToken, fencegate.LeaseLost) as e:
                late = outcome(e)
            try:
                await client.put(key, {"by": "zombie", "n": 3}, token=lease.token, scope=lease.scope)
                raw: dict = {"error": None}
            except fencegate.StaleToken as e:
                raw = outcome(e)
            say(late=late, raw=raw, lost=lease.lost.is_set(),
                lost_reason=type(lease.lost_reason).__name__, token=lease.token)
        say(exited=True)


if __name__ == "__main__":
    url, lock, key, ttl, mode = sys.argv[1:6]
    if mode == "async":
        asyncio.run(run_async(url, lock, key, int(ttl)))
    else:
        run_sync(url, lock, key, int(ttl))
