"""kv, batch, fences and locks against the fencegate under test (FENCEGATE_URL)."""

from __future__ import annotations

import pytest

import fencegate
from fencegate import MAX_TOKEN, ops


def test_put_get_delete_round_trip(client, name):
    key = f"{name}/k"
    w = client.put(key, {"total": 120, "items": ["a", "é"]}, token=7)
    assert w.created and w.fence_token == 7 and w.key == key and w.scope is None
    e = client.get(key)
    assert e.value == {"total": 120, "items": ["a", "é"]}
    assert e.fence_token == 7 and isinstance(e.fence_token, int)
    w2 = client.put(key, [1, 2], token="7")  # equal tokens are accepted; a str token works
    assert not w2.created and w2.version == 2
    d = client.delete(key, token=8)
    assert d.deleted and d.fence_token == 8
    with pytest.raises(fencegate.NotFound):
        client.get(key)
    # the tombstone keeps the fence
    with pytest.raises(fencegate.StaleToken) as ei:
        client.put(key, 1, token=7)
    assert ei.value.presented == 7 and ei.value.current == 8 and ei.value.key == key


def test_keys_are_one_path_segment(client, name):
    for key in (f"{name}/a/b", f"{name} café %25 ?#&", f"{name}\u202e"):
        client.put(key, "v", token=1)
        assert client.get(key).key == key


@pytest.mark.parametrize("tok", [2**53 + 1, 2**62 + 12345, MAX_TOKEN - 1, MAX_TOKEN])
def test_tokens_above_2_53_round_trip_exactly(client, name, tok):
    key = f"{name}/big"
    w = client.put(key, {"n": tok}, token=tok)  # value too: an int in a JSON body
    assert w.fence_token == tok
    e = client.get(key)
    assert e.fence_token == tok and type(e.fence_token) is int
    assert e.value == {"n": tok}
    if tok < MAX_TOKEN:
        with pytest.raises(fencegate.StaleToken) as ei:
            client.put(key, 0, token=tok - 1)
        assert ei.value.presented == tok - 1 and ei.value.current == tok
    f = client.claim(f"{name}-scope", token=str(tok))
    assert f.fence_token == tok and client.get_fence(f"{name}-scope").fence_token == tok


def test_tokens_are_checked_before_sending(client, name):
    with pytest.raises(TypeError):
        client.put(f"{name}/x", 1, token=1.0)  # a float has already lost precision
    with pytest.raises(TypeError):
        client.put(f"{name}/x", 1, token=True)
    with pytest.raises(ValueError):
        client.put(f"{name}/x", 1, token=-1)
    with pytest.raises(ValueError):
        client.put(f"{name}/x", 1, token=MAX_TOKEN + 1)
    with pytest.raises(ValueError):
        client.put(f"{name}/x", 1, token="1e3")
    assert fencegate.token_str("007") == "7"


def test_scoped_writes_and_claims(client, name):
    scope = f"{name}-lock"
    client.put(f"{name}/a", 1, token=5, scope=scope)
    f = client.claim(scope, token=9)
    assert f.fence_token == 9 and not f.created
    # a zombie with token 5 cannot write even a key the new holder has not touched
    with pytest.raises(fencegate.StaleToken) as ei:
        client.put(f"{name}/untouched", 1, token=5, scope=scope)
    assert ei.value.scope == scope and ei.value.current == 9 and ei.value.presented == 5
    # nor step around the scope by leaving it out
    with pytest.raises(fencegate.ScopeMismatch) as em:
        client.put(f"{name}/a", 2, token=9)
    assert em.value.scope == scope and em.value.presented_scope is None and em.value.key == f"{name}/a"
    assert client.claim(f"{name}-new", token=1).created


def test_batch(client, name):
    client.put(f"{name}/b", "old", token=10)
    r = client.batch([ops.put(f"{name}/a", {"x": 1}), ops.delete(f"{name}/b")], token=10)
    assert r.fence_token == 10 and [(x.op, x.status) for x in r.results] == [("put", 201), ("delete", 200)]
    client.put(f"{name}/c", "newer", token=20)
    with pytest.raises(fencegate.StaleToken) as ei:
        client.batch([ops.put(f"{name}/a", 2), ops.put(f"{name}/c", 2)], token=15)
    assert [(k["key"], k["current_token"]) for k in ei.value.stale_keys] == [(f"{name}/c", 20)]
    assert client.get(f"{name}/a").value == {"x": 1}  # nothing applied
    with pytest.raises(fencegate.InvalidBatch):
        client.batch([], token=1)


def test_locks(client, name):
    g = client.acquire(name, ttl_ms=5000, owner="worker-1")
    assert g.token >= 1 and g.scope == name and g.owner == "worker-1"
    h = client.holder(name)
    assert h is not None and h.owner == "worker-1" and 0 < h.remaining_ms <= 5000
    with pytest.raises(fencegate.LockHeld) as ei:
        client.acquire(name, ttl_ms=5000, owner="worker-2")
    assert ei.value.holder == "worker-1" and ei.value.remaining_ms > 0
    assert client.renew(name, token=g.token, ttl_ms=5000).token == g.token
    assert client.release(name, token=g.token).released
    assert client.holder(name) is None
    with pytest.raises(fencegate.LockLost):
        client.release(name, token=g.token)
    g2 = client.acquire(name, ttl_ms=5000)
    assert g2.token > g.token
    client.release(name, token=g2.token)


def test_health_and_ready(client):
    assert client.health()["status"] == "ok"
    assert client.ready()["status"] == "ready"


def test_admin_reset_retire_audit(client, name):
    scope = f"{name}-s"
    client.claim(scope, token=100)
    r = client.reset_fence(scope, to=5, reason="python client test")
    assert (r.from_, r.to, r.target) == (100, 5, "scope") and r.audit_id > 0
    with pytest.raises(fencegate.ResetNotBelow):
        client.reset_fence(scope, to=50, reason="not below")
    client.put(f"{name}/k", 1, token=6, scope=scope)
    rk = client.reset_key(f"{name}/k", scope=None, reason="unbind")
    assert rk.target == "key"
    client.put(f"{name}/k", 2, token=1)  # unscoped now
    g = client.acquire(f"{name}-lock", ttl_ms=5000)
    rr = client.retire_lock(f"{name}-lock", reason="retire it")
    assert rr.target == "lock" and rr.to == g.token
    entries = client.audit(limit=20)
    assert any(e.name == scope and e.action == "reset" and e.to == 5 for e in entries)
    assert any(e.name == f"{name}-lock" and e.action == "retire" for e in entries)
