#!/usr/bin/env python3
"""Unrelated writes' latency while a SQL transaction holds one scope's fence.

usage: held_scope.py FENCEGATE_BINARY [SECONDS]   (env: DATABASE_URL, an admin URL;
       HELD_SCOPE_NONE=1: no holder and no writers under `victim`, for the baseline;
       HELD_SCOPE_UNFENCED=1: the holder's transaction takes a transaction id and sleeps, but
       fences nothing: what any long transaction costs PostgreSQL's updates, apart from fencing;
       HELD_SCOPE_CLAIMS=N: N threads claim the held scope (POST /v1/fences/victim) instead of
       4 threads writing under it)

Creates a database, starts the binary on it (default config: lock_timeout_ms 5000), and then:
a psql session runs `BEGIN; SELECT fencegate.fence('victim', 1); SELECT pg_sleep(...)` (a frozen
SQL writer); 4 threads PUT under scope `victim` in a loop (each waits, gets 503, retries); 16
threads, each on a keep-alive connection of its own, PUT their own key (8 unscoped, 8 under
scopes of their own) for SECONDS. Prints the unrelated writes' count, statuses, p50, p99 and max.
Standard library only, plus psql on PATH.
"""
import http.client
import json
import os
import re
import subprocess
import sys
import threading
import time

binary = sys.argv[1]
seconds = float(sys.argv[2]) if len(sys.argv) > 2 else 8.0
admin = os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres")
db = f"fencegate_held_{os.getpid()}"
base = admin.rsplit("/", 1)[0]
url = f"{base}/{db}"
subprocess.run(["psql", admin, "-qc", f"CREATE DATABASE {db}"], check=True)
server = subprocess.Popen(
    [binary, "serve", "--listen", "127.0.0.1:0", "--database-url", url],
    stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    env={**os.environ, "FENCEGATE_LOG": "error"},
)
holder = None
try:
    line = server.stdout.readline()
    port = int(re.search(r":(\d+)\s*$", line.strip()).group(1))

    def put(conn, key, token, scope=None):
        headers = {"X-Fencing-Token": str(token), "Content-Type": "application/json"}
        if scope:
            headers["X-Fencing-Scope"] = scope
        conn.request("PUT", f"/v1/kv/{key}", body=json.dumps({"n": 1}), headers=headers)
        r = conn.getresponse()
        r.read()
        return r.status

    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    assert put(c, "warm-up", 1) == 201
    none = os.environ.get("HELD_SCOPE_NONE") == "1"
    unfenced = os.environ.get("HELD_SCOPE_UNFENCED") == "1"
    held = "pg_current_xact_id()" if unfenced else "fencegate.fence('victim', 1)"
    holder = None if none else subprocess.Popen(
        ["psql", url, "-qc",
         f"BEGIN; SELECT {held}; SELECT pg_sleep({seconds + 30}); COMMIT;"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    time.sleep(1.0)  # the holder has fenced
    stop = threading.Event()
    victims = {"503": 0, "other": 0}

    claims = int(os.environ.get("HELD_SCOPE_CLAIMS", "0"))

    def victim(i):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        while not stop.is_set():
            if claims:
                conn.request("POST", "/v1/fences/victim", headers={"X-Fencing-Token": "2"})
                r = conn.getresponse()
                r.read()
                s = r.status
            else:
                s = put(conn, f"victim-{i}", 2, "victim")
            victims["503" if s == 503 else "other"] += 1

    results = []
    lock = threading.Lock()

    def writer(i):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        scope = f"other-{i}" if i % 2 else None
        mine, token = [], 1
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            t0 = time.monotonic()
            s = put(conn, f"unrelated-{i}", token, scope)
            mine.append((s, time.monotonic() - t0))
            token += 1
        with lock:
            results.extend(mine)

    vs = [] if none or unfenced else [threading.Thread(target=victim, args=(i,), daemon=True) for i in range(claims or 4)]
    for t in vs:
        t.start()
    time.sleep(0.5)  # the victims' writes wait on the fence
    ws = [threading.Thread(target=writer, args=(i,)) for i in range(16)]
    for t in ws:
        t.start()
    for t in ws:
        t.join()
    stop.set()
    lat = sorted(d for _, d in results)
    statuses = {}
    for s, _ in results:
        statuses[s] = statuses.get(s, 0) + 1

    def pct(p):
        return lat[min(len(lat) - 1, int(len(lat) * p))] * 1000 if lat else float("nan")

    print(f"{binary}: {len(results)} unrelated writes in {seconds:.0f} s ({len(results) / seconds:.0f}/s), "
          f"statuses {statuses}, p50 {pct(0.5):.1f} ms, p99 {pct(0.99):.1f} ms, max {lat[-1] * 1000 if lat else 0:.1f} ms; "
          f"writes under the held scope: {victims}")
finally:
    if holder:
        holder.kill()
    server.terminate()
    server.wait(timeout=15)
    subprocess.run(["psql", admin, "-qc", f"DROP DATABASE IF EXISTS {db} WITH (FORCE)"])
