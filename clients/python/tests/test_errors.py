"""Every problem type the library maps, raised by a real server on its real status.

Most come from the fencegate under test; those that need a configuration (auth, issuers,
reserved lock names, the jump cap, bindings, a legacy table, an unmigrated database) come from
servers these tests start themselves (FENCEGATE_BIN, on DATABASE_URL)."""

from __future__ import annotations

import base64
import hashlib
import os
import secrets
import shutil
import subprocess

import pytest

import fencegate
from fencegate import MAX_TOKEN

from conftest import RUN, start_server

HMAC_SECRET = secrets.token_urlsafe(40)
ADMIN_KEY = "fgk_admin_" + secrets.token_urlsafe(24)
LIMITED_KEY = "fgk_limited_" + secrets.token_urlsafe(24)
TABLE = f"pyclient_orders_{RUN}"


def _ed25519_keypair():
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    k = Ed25519PrivateKey.generate()
    seed = k.private_bytes_raw() if hasattr(k, "private_bytes_raw") else None
    if seed is None:  # cryptography < 40
        from cryptography.hazmat.primitives.serialization import NoEncryption, PrivateFormat
        seed = k.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())
    pub = k.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    return seed, base64.b64encode(pub).decode()


ED_SEED, ED_PUB = _ed25519_keypair()


def _psql(sql: str) -> None:
    db = os.environ.get("DATABASE_URL", "")
    if not db.startswith(("postgres://", "postgresql://")):
        pytest.fail("these tests need DATABASE_URL=postgres://... (the PostgreSQL database the "
                    "tests' own fencegate servers use; legacy tables are PostgreSQL only)",
                    pytrace=False)
    if shutil.which("psql") is None:
        pytest.fail("these tests need psql to create a legacy table (Debian: apt-get install "
                    "postgresql-client)", pytrace=False)
    subprocess.run(["psql", db, "-v", "ON_ERROR_STOP=1", "-qc", sql], check=True,
                   stdout=subprocess.DEVNULL)


@pytest.fixture(scope="session")
def strict(fencegate_bin):
    """A fencegate with auth, two issuers, reserved lock names, a jump cap, a binding and a
    legacy table. Yields (url, admin client)."""
    _psql(f"CREATE TABLE IF NOT EXISTS public.{TABLE} (tenant text NOT NULL, order_no integer NOT NULL, "
          f"amount integer NOT NULL DEFAULT 0 CHECK (amount >= 0), note text, "
          f"PRIMARY KEY (tenant, order_no))")
    sha = lambda k: hashlib.sha256(k.encode()).hexdigest()  # noqa: E731
    config = f"""
[kv]
max_token_jump = 1000

[locks]
names = ["reserved/"]

[[scopes]]
name = "bound"
keys = ["bound/"]

[[issuers]]
name = "hm"
scopes = ["hm/"]
hmac_sha256_secret_env = "PYTEST_FG_HMAC"

[[issuers]]
name = "ed"
scopes = ["ed/"]
ed25519_public_key = "{ED_PUB}"

[[resources]]
name = "orders"
table = "public.{TABLE}"
key = ["tenant", "order_no"]
fence = "ledger"

[[auth.keys]]
name = "admin"
sha256 = "{sha(ADMIN_KEY)}"
rights = ["admin"]
prefixes = [""]
tables = ["orders"]

[[auth.keys]]
name = "limited"
sha256 = "{sha(LIMITED_KEY)}"
rights = ["read", "write"]
prefixes = ["mine/"]
"""
    srv = start_server(fencegate_bin, config, env={"PYTEST_FG_HMAC": HMAC_SECRET})
    try:
        with fencegate.Client(srv.url, api_key=ADMIN_KEY) as c:
            yield srv.url, c
    finally:
        srv.stop()
        _psql(f"DROP TABLE IF EXISTS public.{TABLE}")


# -- on the fencegate under test ---------------------------------------------------------------

def test_malformed_token(client, name):
    for bad in ("007", "-1", "1e3", "0x10", "", str(MAX_TOKEN + 1)):
        with pytest.raises(fencegate.MalformedToken) as ei:
            client.request("PUT", f"/v1/kv/{name}", headers={"X-Fencing-Token": bad}, json=1)
        assert ei.value.status == 400 and ei.value.slug == "malformed-token"
        assert isinstance(ei.value, fencegate.BadRequest)


def test_missing_token(client, name):
    with pytest.raises(fencegate.MissingToken) as ei:
        client.request("PUT", f"/v1/kv/{name}", json=1)
    assert ei.value.status == 428


def test_invalid_key_scope_json_request(client, name):
    with pytest.raises(fencegate.InvalidKey):
        client.put(f"{name}\x01", 1, token=1)
    with pytest.raises(fencegate.InvalidKey):
        client.put("x" * 600, 1, token=1)
    with pytest.raises(fencegate.InvalidScope):
        client.put(name, 1, token=1, scope="bad\x02scope")
    with pytest.raises(fencegate.InvalidJson) as ej:
        client.put(name, "nul \u0000 inside", token=1)
    assert ej.value.status == 400
    with pytest.raises(fencegate.InvalidRequest):
        client.acquire(name, ttl_ms=0)
    with pytest.raises(fencegate.InvalidBatch):
        client.batch([{"op": "frobnicate", "key": name}], token=1)


def test_not_found_and_method_not_allowed(client, name):
    with pytest.raises(fencegate.NotFound) as ei:
        client.get(f"{name}/never")
    assert ei.value.status == 404
    with pytest.raises(fencegate.NotFound):
        client.get_fence(f"{name}-never")
    with pytest.raises(fencegate.NotFound):
        client.request("GET", "/v1/nothing-here")
    with pytest.raises(fencegate.MethodNotAllowed) as em:
        client.request("PATCH", f"/v1/kv/{name}", json=1, headers={"X-Fencing-Token": "1"})
    assert em.value.status == 405


def test_too_large_and_media_type(client, name):
    with pytest.raises(fencegate.PayloadTooLarge) as ei:
        client.put(name, "x" * (2 << 20), token=1)
    assert ei.value.status == 413
    with pytest.raises(fencegate.UnsupportedMediaType) as eu:
        client.request("PUT", f"/v1/kv/{name}", json=1,
                       headers={"X-Fencing-Token": "1", "Content-Type": "text/plain"})
    assert eu.value.status == 415


def test_misdirected_request(client, name):
    with pytest.raises(fencegate.MisdirectedRequest) as ei:
        client.request("GET", f"/v1/kv/{name}", headers={"Host": "rebound.example"})
    assert ei.value.status == 421


def test_fencing_conflicts(client, name):
    client.put(name, 1, token=5, scope=f"{name}-a")
    with pytest.raises(fencegate.ScopeMismatch) as es:
        client.put(name, 1, token=5, scope=f"{name}-b")
    e = es.value
    assert (e.status, e.key, e.scope, e.presented_scope) == (409, name, f"{name}-a", f"{name}-b")
    assert isinstance(e, fencegate.Conflict) and isinstance(e, fencegate.FencingError)
    with pytest.raises(fencegate.StaleToken) as et:
        client.put(name, 1, token=4, scope=f"{name}-a")
    assert (et.value.status, et.value.presented, et.value.current, et.value.scope) == (412, 4, 5, f"{name}-a")


def test_lock_errors(client, name):
    g = client.acquire(name, ttl_ms=5000, owner="holder-1")
    with pytest.raises(fencegate.LockHeld) as eh:
        client.acquire(name, ttl_ms=5000, owner="holder-2")
    assert (eh.value.status, eh.value.holder) == (409, "holder-1") and eh.value.remaining_ms > 0
    with pytest.raises(fencegate.LockLost) as el:
        client.renew(name, token=g.token - 1 if g.token > 1 else g.token + 1, ttl_ms=5000)
    assert el.value.status == 409 and el.value.holder == "holder-1"
    # a token above the latest grant, under the lock's scope
    with pytest.raises(fencegate.TokenNotIssued) as en:
        client.put(f"{name}/k", 1, token=g.token + 1, scope=name)
    assert (en.value.status, en.value.presented, en.value.latest_issued) == (422, g.token + 1, g.token)
    client.release(name, token=g.token)
    # a scope pushed to the largest token: no lock can be granted on it any more
    client.claim(f"{name}-max", token=MAX_TOKEN)
    with pytest.raises(fencegate.LockExhausted) as ex:
        client.acquire(f"{name}-max", ttl_ms=1000)
    assert ex.value.status == 409


def test_reset_not_below(client, name):
    client.claim(name, token=10)
    with pytest.raises(fencegate.ResetNotBelow) as ei:
        client.reset_fence(name, to=10, reason="not below")
    assert ei.value.status == 409


def test_unknown_type_maps_by_status():
    assert fencegate.error_class(409, "something-new") is fencegate.Conflict
    assert fencegate.error_class(422, None) is fencegate.Unprocessable
    assert fencegate.error_class(418, None) is fencegate.FencegateError
    assert fencegate.error_class(502, None) is fencegate.ServerError
    assert fencegate.error_class(412, "stale-token") is fencegate.StaleToken


def test_transport_error():
    with fencegate.Client("http://127.0.0.1:1", timeout=2) as c:
        with pytest.raises(fencegate.TransportError) as ei:
            c.get("x")
    assert ei.value.status is None and isinstance(ei.value, fencegate.FencegateError)


# -- on servers of our own ------------------------------------------------------------------

def test_unauthorized_and_forbidden(strict):
    url, _ = strict
    with fencegate.Client(url) as anon, fencegate.Client(url, api_key="fgk_nope") as wrong:
        for c in (anon, wrong):
            with pytest.raises(fencegate.Unauthorized) as ei:
                c.get(f"mine/{RUN}")
            assert ei.value.status == 401 and ei.value.slug == "unauthenticated"
            assert ei.value.headers.get("www-authenticate", "").lower().startswith("bearer")
    with fencegate.Client(url, api_key=LIMITED_KEY) as lim:
        lim.put(f"mine/{RUN}", 1, token=1)
        with pytest.raises(fencegate.Forbidden) as ef:
            lim.put(f"theirs/{RUN}", 1, token=1)
        assert (ef.value.status, ef.value.right, ef.value.name) == (403, "write", f"theirs/{RUN}")
        with pytest.raises(fencegate.Forbidden) as el:
            lim.acquire(f"mine/{RUN}-lock", ttl_ms=1000)
        assert el.value.right == "lock"


def test_token_jump(strict):
    _, c = strict
    key = f"jump/{RUN}"
    c.put(key, 1, token=500)
    with pytest.raises(fencegate.TokenJump) as ei:
        c.put(key, 1, token=5000)
    e = ei.value
    assert (e.status, e.presented, e.current, e.max_jump, e.key) == (422, 5000, 500, 1000, key)


def test_reserved_scope_before_first_grant(strict):
    _, c = strict
    scope = f"reserved/{RUN}"
    with pytest.raises(fencegate.TokenNotIssued) as ei:
        c.claim(scope, token=1)
    assert ei.value.latest_issued == 0 and ei.value.scope == scope
    with c.lease(scope, ttl_ms=2000) as lease:
        assert lease.put(f"{scope}/k", "fine").fence_token == lease.token


def test_issuer_proofs(strict):
    url, c = strict
    scope = f"hm/{RUN}"
    with pytest.raises(fencegate.MissingTokenProof) as em:
        c.put(f"{scope}/k", 1, token=3, scope=scope)
    assert em.value.status == 422
    with pytest.raises(fencegate.InvalidTokenProof) as ei:
        c.put(f"{scope}/k", 1, token=3, scope=scope, proof=fencegate.sign_hmac(HMAC_SECRET, scope, 4))
    assert ei.value.status == 422
    ok = c.put(f"{scope}/k", 1, token=3, scope=scope, proof=fencegate.sign_hmac(HMAC_SECRET, scope, 3))
    assert ok.fence_token == 3
    # a client-wide signer signs every scoped write, claims and batches included
    signer = lambda s, t: fencegate.sign_hmac(HMAC_SECRET, s, t)  # noqa: E731
    with fencegate.Client(url, api_key=ADMIN_KEY, signer=signer) as signed:
        assert signed.claim(scope, token=7).fence_token == 7
        signed.batch([fencegate.ops.put(f"{scope}/b", 2)], token=7, scope=scope)
    # Ed25519
    escope = f"ed/{RUN} café"
    with pytest.raises(fencegate.InvalidTokenProof):
        c.put(f"{RUN}/ed", 1, token=9, scope=escope, proof=fencegate.sign_hmac(HMAC_SECRET, escope, 9))
    assert c.put(f"{RUN}/ed", 1, token=9, scope=escope,
                 proof=fencegate.sign_ed25519(ED_SEED, escope, 9)).scope == escope
    # no built-in lock on an issuer's scope
    with pytest.raises(fencegate.ScopeHasIssuer) as eh:
        c.acquire(scope, ttl_ms=1000)
    assert (eh.value.status, eh.value.scope, eh.value.issuer) == (409, scope, "hm")


def test_proofs_match_fencegate_sign(fencegate_bin, tmp_path):
    for scope, token in (("jobs/a", 1), ("caf\u00e9 \u202e", MAX_TOKEN), ("x", 2**53 + 1)):
        out = subprocess.run([fencegate_bin, "sign", "--scope", scope, "--token", str(token),
                              "--hmac-secret-env", "PYTEST_FG_HMAC"], capture_output=True,
                             text=True, check=True, env={**os.environ, "PYTEST_FG_HMAC": HMAC_SECRET})
        assert out.stdout.strip() == fencegate.sign_hmac(HMAC_SECRET, scope, token)
        keyfile = tmp_path / "ed.key"
        keyfile.write_text(base64.b64encode(ED_SEED).decode())
        out = subprocess.run([fencegate_bin, "sign", "--scope", scope, "--token", str(token),
                              "--ed25519-key-file", str(keyfile)], capture_output=True, text=True,
                             check=True)
        assert out.stdout.strip() == fencegate.sign_ed25519(ED_SEED, scope, str(token))


def test_binding_conflict(strict):
    _, c = strict
    with pytest.raises(fencegate.ScopeMismatch):
        c.put(f"bound/{RUN}", 1, token=1, scope="elsewhere")
    with pytest.raises(fencegate.BindingConflict) as ei:
        c.rebind_keys("bound/", scope=None, reason="contradicts [[scopes]]")
    assert ei.value.status == 409


def test_tables(strict):
    _, c = strict
    key = (f"acme,{RUN}", 42)  # a comma inside a value is encoded for you
    w = c.table_put("orders", key, {"amount": 10, "note": "first"}, token=3)
    assert w.created and w.fence_token == 3 and w.resource == "orders"
    row = c.table_get("orders", key)
    assert row.row["amount"] == 10 and row.row["tenant"] == f"acme,{RUN}" and row.fence_token == 3
    c.table_patch("orders", key, {"note": "patched"}, token=3)
    assert c.table_get("orders", key).row["note"] == "patched"
    with pytest.raises(fencegate.StaleToken) as es:
        c.table_put("orders", key, {"amount": 1}, token=2)
    assert (es.value.resource, es.value.current) == ("orders", 3)
    with pytest.raises(fencegate.InvalidValue) as ev:
        c.table_put("orders", key, {"amount": -1}, token=3)
    assert ev.value.status == 422
    with pytest.raises(fencegate.InvalidRow) as er:
        c.table_put("orders", key, {"no_such_column": 1}, token=3)
    assert er.value.column == "no_such_column"
    with pytest.raises(fencegate.InvalidKey) as ek:
        c.table_get("orders", ("acme", "not-a-number"))
    assert ek.value.column == "order_no"
    r = c.batch([fencegate.ops.table_patch("orders", key, {"amount": 11}),
                 fencegate.ops.put(f"tables/{RUN}", 1)], token=4)
    assert [x.status for x in r.results] == [200, 201] and r.results[0].resource == "orders"
    assert c.table_delete("orders", key, token=4).deleted
    with pytest.raises(fencegate.NotFound):
        c.table_get("orders", key)
    with pytest.raises(fencegate.NotFound):
        c.table_get("no-such-resource", "1")


def test_unavailable(fencegate_bin):
    srv = start_server(fencegate_bin, "[database]\nmigrate_on_start = false\n", sqlite=True)
    try:
        with fencegate.Client(srv.url) as c:
            with pytest.raises(fencegate.Unavailable) as ei:
                c.ready()
            assert ei.value.status == 503 and ei.value.retry_after == 1.0
    finally:
        srv.stop()


def test_every_problem_type_of_the_server_has_a_class_of_its_own(url):
    """The running server's /openapi.json lists every problem type it defines; each maps to a
    class named by its slug (a new type the library does not map fails here)."""
    import json
    import urllib.request

    from fencegate._errors import BY_SLUG, PROBLEM_BASE, error_class

    with urllib.request.urlopen(url + "/openapi.json") as r:
        doc = json.load(r)
    types = set()

    def walk(v):
        if isinstance(v, str):
            if v.startswith(PROBLEM_BASE):
                types.add(v)
        elif isinstance(v, dict):
            for x in v.values():
                walk(x)
        elif isinstance(v, list):
            for x in v:
                walk(x)

    walk(doc)
    assert len(types) >= 30, types
    for t in sorted(types):
        slug = t[len(PROBLEM_BASE):]
        assert slug in BY_SLUG, f"{t}: no class of its own"
        assert error_class(409, slug).slug == slug
    assert len(BY_SLUG) == len(types), sorted(set(BY_SLUG) ^ {t[len(PROBLEM_BASE):] for t in types})
