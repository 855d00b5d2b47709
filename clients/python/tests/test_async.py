"""The AsyncClient on the main paths."""

from __future__ import annotations

import asyncio
import time

import pytest

import fencegate
from fencegate import MAX_TOKEN


def run(coro):
    return asyncio.run(coro)


def test_async_kv_round_trip_and_big_tokens(url, name):
    async def main():
        async with fencegate.AsyncClient(url) as c:
            w = await c.put(f"{name}/k", {"a": 1}, token=2**53 + 1)
            assert w.created and w.fence_token == 2**53 + 1
            e = await c.get(f"{name}/k")
            assert e.value == {"a": 1} and e.fence_token == 2**53 + 1
            with pytest.raises(fencegate.StaleToken) as ei:
                await c.put(f"{name}/k", 1, token=2**53)
            assert (ei.value.presented, ei.value.current) == (2**53, 2**53 + 1)
            await c.put(f"{name}/max", 1, token=MAX_TOKEN)
            assert (await c.get(f"{name}/max")).fence_token == MAX_TOKEN
            r = await c.batch([fencegate.ops.put(f"{name}/b", 1)], token=3, scope=f"{name}-s")
            assert r.scope == f"{name}-s"
            assert (await c.claim(f"{name}-s", token=4)).fence_token == 4
            assert (await c.get_fence(f"{name}-s")).fence_token == 4
            assert (await c.delete(f"{name}/k", token=2**53 + 1)).deleted
            with pytest.raises(fencegate.NotFound):
                await c.get(f"{name}/k")
            with pytest.raises(fencegate.ScopeMismatch):
                await c.put(f"{name}/b", 1, token=4)
            assert (await c.ready())["status"] == "ready"
    run(main())


def test_async_locks_and_errors(url, name):
    async def main():
        async with fencegate.AsyncClient(url) as c:
            g = await c.acquire(name, ttl_ms=5000, owner="a")
            with pytest.raises(fencegate.LockHeld) as ei:
                await c.acquire(name, ttl_ms=5000, owner="b")
            assert ei.value.holder == "a"
            assert (await c.holder(name)).owner == "a"
            await c.release(name, token=g.token)
            assert await c.holder(name) is None
            with pytest.raises(fencegate.LockLost):
                await c.release(name, token=g.token)
            with pytest.raises(fencegate.MissingToken):
                await c.request("PUT", f"/v1/kv/{name}", json=1)
    run(main())


def test_async_lease_renews_past_its_ttl(url, name):
    async def main():
        async with fencegate.AsyncClient(url) as c:
            async with c.lease(name, ttl_ms=600, owner="async-renewer") as lease:
                assert isinstance(lease.lost, asyncio.Event)
                t0 = time.monotonic()
                while time.monotonic() - t0 < 2.0:
                    await asyncio.sleep(0.25)
                    assert (await c.holder(name)).owner == "async-renewer"
                assert not lease.lost.is_set()
                w = await lease.put(f"{name}/k", "valid")
                assert w.fence_token == lease.token and w.scope == name
                assert (await lease.get(f"{name}/k")).value == "valid"
            assert await c.holder(name) is None
            with pytest.raises(fencegate.LeaseLost):
                await lease.put(f"{name}/k", "after release")
    run(main())


def test_async_lease_wait_and_loss(url, name):
    async def main():
        async with fencegate.AsyncClient(url) as c:
            first = await c.lease(name, ttl_ms=5000, owner="first").acquire()
            with pytest.raises(fencegate.LockHeld):
                await c.lease(name, ttl_ms=5000).acquire()

            async def later():
                await asyncio.sleep(0.5)
                await first.release()

            task = asyncio.ensure_future(later())
            async with c.lease(name, ttl_ms=900, wait=5) as lease:
                await task
                assert lease.token > first.token
                await c.retire_lock(name, reason="python async test ends this lease")
                await asyncio.wait_for(lease.lost.wait(), 2.0)
                assert isinstance(lease.lost_reason, fencegate.LockLost)
                with pytest.raises(fencegate.LeaseLost):
                    await lease.put(f"{name}/k", 1)

            # a 412 under a lease marks it lost
            old = await c.lease(name, ttl_ms=10_000, renew_every_ms=60_000).acquire()
            await c.retire_lock(name, reason="python async test hands the lock over")
            async with c.lease(name, ttl_ms=5000) as new:
                await new.put(f"{name}/n", 1)
                with pytest.raises(fencegate.StaleToken):
                    await old.put(f"{name}/n", 2)
                assert old.lost.is_set()
            await old.release()
            assert (await c.get(f"{name}/n")).value == 1
    run(main())
