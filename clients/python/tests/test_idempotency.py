"""Idempotency-Key: every write carries one, a retry carries the same, and a write that landed
is answered with its first outcome even after a newer holder has fenced the writer out.

The lost answers here are real: the request reaches the fencegate under test and its answer is
dropped by the transport, as a cut connection would."""

from __future__ import annotations

import asyncio
from typing import Callable, List

import httpx
import pytest

import fencegate


class Recording(httpx.HTTPTransport):
    """Sends every request, keeps it; ``lose_first`` drops the first keyed answer (after the
    server applied the write) and runs ``between`` before the client sees the error."""

    def __init__(self, lose_first: bool = False, between: Callable[[], None] = lambda: None) -> None:
        super().__init__()
        self.sent: List[httpx.Request] = []
        self.lose_first = lose_first
        self.between = between

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.sent.append(request)
        resp = super().handle_request(request)
        if self.lose_first and "idempotency-key" in request.headers:
            self.lose_first = False
            resp.read()
            resp.close()
            self.between()
            raise httpx.ReadError("the answer was lost (test)", request=request)
        return resp


def test_the_same_key_after_a_newer_holder_gets_the_first_answer_replayed(client, name):
    key, scope, ik = f"{name}/k", f"{name}-s", fencegate.new_idempotency_key()
    first = client.put(key, {"n": 1}, token=5, scope=scope, idempotency_key=ik)
    assert first.created and not first.replayed
    client.claim(scope, token=6)  # a newer holder
    again = client.put(key, {"n": 1}, token=5, scope=scope, idempotency_key=ik)
    assert again.replayed and again == first and again.created
    # without the key the same write is judged again: the newer holder fenced it out
    with pytest.raises(fencegate.StaleToken):
        client.put(key, {"n": 1}, token=5, scope=scope)
    # the same key with another write is refused and changes nothing
    with pytest.raises(fencegate.IdempotencyKeyReused):
        client.put(key, {"n": 2}, token=7, scope=scope, idempotency_key=ik)
    assert client.get(key).value == {"n": 1}


def test_every_write_sends_its_own_key(url, name):
    rec = Recording()
    scope = f"{name}-s"
    with fencegate.Client(url, transport=rec) as c:
        c.put(f"{name}/a", 1, token=1)
        c.put(f"{name}/a", 2, token=1)
        c.delete(f"{name}/a", token=2)
        c.batch([fencegate.ops.put(f"{name}/b", 1)], token=3)
        c.claim(scope, token=4)
        c.get(f"{name}/b")
        c.acquire(f"{name}-lock", ttl_ms=1000)
    keys = [r.headers.get("idempotency-key") for r in rec.sent]
    writes = [k for k in keys[:5]]
    assert all(k is not None and len(k) == 32 for k in writes), keys
    int(writes[0], 16)  # hex
    assert len(set(writes)) == 5, "two writes without an explicit key sent the same key"
    assert keys[5] is None and keys[6] is None, "a read and a lock acquire take no key"


def test_a_lost_answer_is_retried_with_the_same_key_and_replayed(url, name):
    key, scope = f"{name}/k", f"{name}-s"
    with fencegate.Client(url) as other:
        rec = Recording(lose_first=True, between=lambda: other.claim(scope, token=9))
        with fencegate.Client(url, transport=rec) as c:
            w = c.put(key, "landed", token=8, scope=scope)
    assert w.replayed and w.created and w.fence_token == 8
    assert len(rec.sent) == 2
    assert rec.sent[0].headers["idempotency-key"] == rec.sent[1].headers["idempotency-key"]
    with fencegate.Client(url) as c:
        assert c.get(key).value == "landed"


def test_without_retries_a_lost_answer_is_a_transport_error(url, name):
    rec = Recording(lose_first=True)
    with fencegate.Client(url, transport=rec, retries=0) as c:
        with pytest.raises(fencegate.TransportError):
            c.put(f"{name}/k", 1, token=1)
    assert len(rec.sent) == 1


def test_a_bad_key_is_refused_before_sending(client, name):
    for bad in ("", "a b", "é", "x" * 256):
        with pytest.raises(ValueError):
            client.put(f"{name}/k", 1, token=1, idempotency_key=bad)


class AsyncRecording(httpx.AsyncHTTPTransport):
    def __init__(self, between: Callable[[], "asyncio.Future[object]"]) -> None:
        super().__init__()
        self.sent: List[httpx.Request] = []
        self.between = between
        self.lost = False

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.sent.append(request)
        resp = await super().handle_async_request(request)
        if not self.lost and "idempotency-key" in request.headers:
            self.lost = True
            await resp.aread()
            await resp.aclose()
            await self.between()
            raise httpx.ReadError("the answer was lost (test)", request=request)
        return resp


def test_async_a_lost_answer_is_retried_with_the_same_key_and_replayed(url, name):
    key, scope = f"{name}/k", f"{name}-s"

    async def main():
        async with fencegate.AsyncClient(url) as other:
            rec = AsyncRecording(lambda: other.claim(scope, token=11))
            async with fencegate.AsyncClient(url, transport=rec) as c:
                b = await c.batch([fencegate.ops.put(key, "landed")], token=10, scope=scope)
                assert b.replayed and b.fence_token == 10
                assert rec.sent[0].headers["idempotency-key"] == rec.sent[1].headers["idempotency-key"]
                again = await c.batch([fencegate.ops.put(key, "landed")], token=10, scope=scope,
                                      idempotency_key=rec.sent[0].headers["idempotency-key"])
                assert again.replayed and again == b
                assert (await c.get(key)).value == "landed"

    asyncio.run(main())


def test_lease_writes_take_a_key_too(client, name):
    ik = fencegate.new_idempotency_key()
    with client.lease(name, ttl_ms=10_000) as lease:
        first = lease.put(f"{name}/k", 1, idempotency_key=ik)
        again = lease.put(f"{name}/k", 1, idempotency_key=ik)
        assert again.replayed and again == first
        # every lease write passes the key through (an unknown table: 404, not a TypeError)
        for write in (lambda: lease.table_put("no-such-table", "1", {"a": 1}, idempotency_key=ik),
                      lambda: lease.table_patch("no-such-table", "1", {"a": 1}, idempotency_key=ik),
                      lambda: lease.table_delete("no-such-table", "1", idempotency_key=ik)):
            with pytest.raises(fencegate.NotFound):
                write()
        assert lease.delete(f"{name}/k", idempotency_key=fencegate.new_idempotency_key()).deleted
        assert lease.batch([fencegate.ops.put(f"{name}/b", 2)]).fence_token == lease.token
        assert not lease.claim().replayed


def test_async_lease_writes_take_a_key_too(url, name):
    async def main():
        ik = fencegate.new_idempotency_key()
        async with fencegate.AsyncClient(url) as c:
            async with c.lease(name, ttl_ms=10_000) as lease:
                first = await lease.put(f"{name}/k", 1, idempotency_key=ik)
                again = await lease.put(f"{name}/k", 1, idempotency_key=ik)
                assert again.replayed and again == first
                with pytest.raises(fencegate.NotFound):
                    await lease.table_put("no-such-table", "1", {"a": 1}, idempotency_key=ik)
                with pytest.raises(fencegate.NotFound):
                    await lease.table_patch("no-such-table", "1", {"a": 1}, idempotency_key=ik)
                with pytest.raises(fencegate.NotFound):
                    await lease.table_delete("no-such-table", "1", idempotency_key=ik)

    asyncio.run(main())
