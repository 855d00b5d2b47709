"""Leases: renewal, waiting, loss, and a real zombie frozen with SIGSTOP."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import fencegate

HERE = Path(__file__).resolve().parent


def test_lease_renews_past_its_ttl(client, name):
    with client.lease(name, ttl_ms=600, owner="renewer") as lease:
        assert lease.scope == name and isinstance(lease.token, int)
        t0 = time.monotonic()
        while time.monotonic() - t0 < 2.0:
            time.sleep(0.25)
            h = client.holder(name)
            assert h is not None and h.owner == "renewer"
        assert not lease.lost.is_set()
        w = lease.put(f"{name}/k", {"still": "valid"})
        assert w.fence_token == lease.token and w.scope == name
        assert lease.get(f"{name}/k").value == {"still": "valid"}
        r = lease.batch([fencegate.ops.put(f"{name}/b", 1), fencegate.ops.delete(f"{name}/k")])
        assert r.scope == name
        assert lease.claim().fence_token == lease.token
        assert lease.delete(f"{name}/b").deleted
    assert client.holder(name) is None  # released on exit
    with pytest.raises(fencegate.LeaseLost):
        lease.put(f"{name}/k", "after release")


def test_lease_wait(client, name):
    first = client.lease(name, ttl_ms=5000, owner="first").acquire()
    with pytest.raises(fencegate.LockHeld) as ei:
        client.lease(name, ttl_ms=5000, wait=0).acquire()
    assert ei.value.holder == "first"
    threading.Timer(0.5, first.release).start()
    t0 = time.monotonic()
    with client.lease(name, ttl_ms=5000, owner="second", wait=5) as second:
        assert second.token > first.token
        assert 0.3 < time.monotonic() - t0 < 5
    with client.lease(name, ttl_ms=5000, owner="third").acquire() as held:
        with pytest.raises(fencegate.LockHeld):
            client.lease(name, ttl_ms=5000, wait=0.3).acquire()
        assert not held.lost.is_set()


def test_lost_when_a_renew_is_refused(client, name):
    with client.lease(name, ttl_ms=900) as lease:
        client.retire_lock(name, reason="the python client's test ends this lease")
        assert lease.lost.wait(2.0), "the renewer did not notice the lease was gone"
        assert isinstance(lease.lost_reason, fencegate.LockLost)
        with pytest.raises(fencegate.LeaseLost) as ei:
            lease.put(f"{name}/k", 1)  # not sent
        assert isinstance(ei.value.__cause__, fencegate.LockLost)
    # leaving the block released a lost lease without an error


def test_lost_when_a_write_is_refused_412(client, name):
    # renews rarely, so the lease itself has not noticed yet when the new holder writes
    lease = client.lease(name, ttl_ms=10_000, renew_every_ms=60_000).acquire()
    try:
        lease.put(f"{name}/k", "old holder")
        client.retire_lock(name, reason="test: hand the lock over")
        with client.lease(name, ttl_ms=5000) as new:
            new.put(f"{name}/other", "new holder")
            assert not lease.lost.is_set()
            with pytest.raises(fencegate.StaleToken) as ei:
                lease.put(f"{name}/k", "zombie")
            assert ei.value.presented == lease.token and ei.value.current == new.token
            assert lease.lost.is_set() and lease.lost_reason is ei.value
            with pytest.raises(fencegate.LeaseLost):
                lease.put(f"{name}/k", "again")
    finally:
        lease.release()
    assert client.get(f"{name}/k").value == "old holder"


def test_lost_when_expiry_passes_without_a_renew(client, name):
    lease = client.lease(name, ttl_ms=300, renew_every_ms=10_000).acquire()
    try:
        assert lease.lost.wait(2.0)
        assert isinstance(lease.lost_reason, fencegate.LeaseLost)
        with pytest.raises(fencegate.LeaseLost):
            lease.put(f"{name}/k", 1)
    finally:
        lease.release()


def _read_json_line(proc: subprocess.Popen, timeout: float) -> dict:
    out: list = []
    t = threading.Thread(target=lambda: out.append(proc.stdout.readline()), daemon=True)
    t.start()
    t.join(timeout)
    if not out or not out[0]:
        proc.kill()
        err = proc.stderr.read() if proc.stderr else ""
        pytest.fail(f"the zombie said nothing within {timeout}s; its stderr:\n{err}")
    return json.loads(out[0])


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_real_zombie(client, url, name, mode):
    lock, key, ttl_ms = name, f"{name}/invoice", 800
    child = subprocess.Popen([sys.executable, str(HERE / "zombie_child.py"), url, lock, key,
                              str(ttl_ms), mode],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
    try:
        ready = _read_json_line(child, 20)
        assert ready["ready"]
        old_token = ready["token"]
        os.kill(child.pid, signal.SIGSTOP)  # a GC pause, a VM stall
        try:
            time.sleep(ttl_ms / 1000 + 0.4)  # past its lease
            with client.lease(lock, ttl_ms=5000, owner="new-holder", wait=10) as new:
                assert new.token > old_token
                new.put(key, {"by": "new holder"})
                os.kill(child.pid, signal.SIGCONT)
                child.stdin.write("go\n")
                child.stdin.flush()
                report = _read_json_line(child, 20)
                # the zombie's next write through its lease: refused by the server (StaleToken)
                # or, if its renewer noticed the lapse first, refused before sending (LeaseLost)
                assert report["late"]["error"] in ("StaleToken", "LeaseLost"), report
                if report["late"]["error"] == "StaleToken":
                    assert report["late"]["presented"] == old_token
                    assert report["late"]["current"] == new.token
                assert report["lost"] is True, report
                # a write with the old token that skips the lease's own checks: the server
                # refuses it, typed, with both tokens
                assert report["raw"] == {"error": "StaleToken", "presented": old_token,
                                         "current": new.token, "scope": lock}, report
                assert _read_json_line(child, 20) == {"exited": True}
                # the new holder's value is intact
                assert client.get(key).value == {"by": "new holder"}
                assert not new.lost.is_set()
        finally:
            os.kill(child.pid, signal.SIGCONT)
        assert child.wait(20) == 0, child.stderr.read()
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


def test_table_writes_under_a_lease_reach_the_server(client, name):
    # Each of the lease's table writes is sent (with its token, scope and Idempotency-Key) and
    # answered: an unknown resource comes back as the server's 404, not a client-side error.
    with client.lease(name, ttl_ms=10_000) as lease:
        for write in (lambda: lease.table_put("no-such-resource", "k", {"a": 1}, idempotency_key="t-put"),
                      lambda: lease.table_patch("no-such-resource", "k", {"a": 1}),
                      lambda: lease.table_delete("no-such-resource", "k")):
            with pytest.raises(fencegate.FencegateError) as ei:
                write()
            assert ei.value.status == 404, ei.value
        assert lease.lost.is_set() is False
