"""The blocking client and its lease."""

from __future__ import annotations

import logging
import random
import ssl
import threading
import time
from types import TracebackType
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Tuple, Type, Union

import httpx

from ._core import (DEFAULT_RETRIES, DEFAULT_TIMEOUT, _UNSET, Api, Call, T, Op, Signer, TableKey,
                    base_headers, check_owner, default_owner, encode_body, raise_for, retry_budget,
                    retry_pause, ssl_config)
from ._errors import (FencegateError, LeaseLost, LockHeld, LockLost, NotFound, ServerError,
                      StaleToken, TransportError)
from ._models import (AdminResult, AuditEntry, BatchResult, DeleteResult, Entry, Fence, Grant,
                      Holder, Released, Row, WriteResult)
from ._tokens import Token

log = logging.getLogger("fencegate")


class Client(Api):
    """A blocking client of one fencegate server.

    ``url``: e.g. ``"http://127.0.0.1:8080"``. ``api_key``: sent as ``Authorization: Bearer``.
    TLS: ``verify`` (``False`` turns checking off; or an ``ssl.SSLContext``), ``cacert`` (a PEM
    bundle to trust instead of the system roots), ``cert`` (a client certificate: one PEM file,
    or ``(cert_file, key_file)``). ``timeout`` in seconds (or an ``httpx.Timeout``).
    ``signer(scope, token) -> proof`` adds ``X-Fencing-Proof`` to every scoped write that does
    not pass ``proof=`` itself. Every write (put, delete, batch, claim, table writes) sends an
    ``Idempotency-Key`` (its ``idempotency_key=``, else 128 random bits) and, after a lost answer
    or a 503 with ``Retry-After``, is sent again with the same key up to ``retries`` times
    (default 2) within ``timeout``: a write that landed is answered with its first outcome
    (``result.replayed``), never a 412 from a newer holder. ``retries=0`` turns this off.
    Safe to share between threads; close it (or use ``with``).
    """

    def __init__(
        self,
        url: str = "http://127.0.0.1:8080",
        api_key: Optional[str] = None,
        *,
        verify: Union[bool, str, ssl.SSLContext] = True,
        cacert: Optional[str] = None,
        cert: Optional[Union[str, Tuple[str, str]]] = None,
        timeout: Union[float, httpx.Timeout] = DEFAULT_TIMEOUT,
        headers: Optional[Mapping[str, str]] = None,
        signer: Optional[Signer] = None,
        retries: int = DEFAULT_RETRIES,
        transport: Optional[httpx.BaseTransport] = None,
    ) -> None:
        super().__init__(signer)
        self.url = url.rstrip("/")
        if retries < 0:
            raise ValueError("retries must be 0 or more")
        self._retries = int(retries)
        self._retry_budget = retry_budget(timeout)
        self._http = httpx.Client(
            base_url=self.url,
            headers=base_headers(api_key, headers),
            verify=ssl_config(verify, cacert, cert),
            timeout=timeout,
            transport=transport,
        )

    @classmethod
    def from_env(cls, **kwargs: Any) -> "Client":
        """``FENCEGATE_URL`` (default ``http://127.0.0.1:8080``), ``FENCEGATE_API_KEY``,
        ``FENCEGATE_CACERT``, as the command line reads them."""
        import os
        kwargs.setdefault("api_key", os.environ.get("FENCEGATE_API_KEY") or None)
        if os.environ.get("FENCEGATE_CACERT"):
            kwargs.setdefault("cacert", os.environ["FENCEGATE_CACERT"])
        return cls(os.environ.get("FENCEGATE_URL") or "http://127.0.0.1:8080", **kwargs)

    # -- plumbing -----------------------------------------------------------------------------

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def request(self, method: str, path: str, *, headers: Optional[Mapping[str, str]] = None,
                json: Any = _UNSET, params: Optional[Mapping[str, Any]] = None) -> httpx.Response:
        """Any request, as sent (no token checks): the answer on 2xx, else its typed error."""
        content, h = encode_body(json)
        h.update(headers or {})
        try:
            resp = self._http.request(method, path, content=content, headers=h, params=params)
        except httpx.TransportError as e:
            raise TransportError(f"{method} {self.url}{path}: {e!r}") from e
        raise_for(resp)
        return resp

    def _run(self, call: Call[T]) -> T:
        if call.idempotency_key is None:
            resp = self.request(call.method, call.path, headers=call.headers, json=call.body,
                                params=call.params)
            return call.result(resp)
        # A keyed write: its retries carry the same Idempotency-Key (it is in call.headers).
        deadline = time.monotonic() + self._retry_budget
        attempt = 0
        while True:
            try:
                resp = self.request(call.method, call.path, headers=call.headers,
                                    json=call.body, params=call.params)
                return call.result(resp)
            except FencegateError as e:
                pause = retry_pause(e, attempt, self._retries, deadline)
                if pause is None:
                    raise
                log.info("fencegate: retrying %s %s with the same Idempotency-Key: %s",
                         call.method, call.path, e)
                attempt += 1
                time.sleep(pause)

    # -- kv -----------------------------------------------------------------------------------

    def get(self, key: str) -> Entry:
        """The key's value and fence; ``NotFound`` if absent or deleted."""
        return self._run(self._c_get(key))

    def put(self, key: str, value: Any, *, token: Token, scope: Optional[str] = None,
            proof: Optional[str] = None, idempotency_key: Optional[str] = None) -> WriteResult:
        """Write ``value`` (any JSON value) under ``token`` (and ``scope``: the lock's name)."""
        return self._run(self._c_put(key, value, token, scope, proof, idempotency_key))

    def delete(self, key: str, *, token: Token, scope: Optional[str] = None,
               proof: Optional[str] = None, idempotency_key: Optional[str] = None) -> DeleteResult:
        """Delete the key; its tombstone keeps the fence."""
        return self._run(self._c_delete(key, token, scope, proof, idempotency_key))

    def batch(self, ops: Iterable[Op], *, token: Token, scope: Optional[str] = None,
              proof: Optional[str] = None, idempotency_key: Optional[str] = None) -> BatchResult:
        """Apply ``ops`` (see ``fencegate.ops``) all or nothing under one token."""
        return self._run(self._c_batch(ops, token, scope, proof, idempotency_key))

    # -- fences -------------------------------------------------------------------------------

    def claim(self, scope: str, *, token: Token, proof: Optional[str] = None,
              idempotency_key: Optional[str] = None) -> Fence:
        """Raise the scope's fence to ``token`` without writing data (a new holder exists)."""
        return self._run(self._c_claim(scope, token, proof, idempotency_key))

    def get_fence(self, scope: str) -> Fence:
        """The scope's fence; ``NotFound`` if it has none."""
        return self._run(self._c_get_fence(scope))

    # -- locks --------------------------------------------------------------------------------

    def acquire(self, name: str, *, ttl_ms: int = 10_000, owner: Optional[str] = None) -> Grant:
        """Take the built-in lock once (``LockHeld`` if held). Prefer ``lease()``."""
        return self._run(self._c_acquire(name, ttl_ms, check_owner(owner or default_owner())))

    def renew(self, name: str, *, token: Token, ttl_ms: int = 10_000) -> Grant:
        return self._run(self._c_renew(name, token, ttl_ms))

    def release(self, name: str, *, token: Token) -> Released:
        return self._run(self._c_release(name, token))

    def holder(self, name: str) -> Optional[Holder]:
        """Who holds the lock (never its token), or ``None`` when it is free."""
        try:
            return self._run(self._c_holder(name))
        except NotFound:
            return None

    def lease(self, name: str, ttl_ms: int = 10_000, owner: Optional[str] = None, *,
              wait: Optional[float] = 0, renew_every_ms: Optional[int] = None) -> "Lease":
        """A lease on the built-in lock ``name``, taken on ``with`` (or ``acquire()``).

        ``wait``: seconds to keep retrying while the lock is held (0: raise ``LockHeld`` at
        once; ``None``: wait for ever). While held, renews every ``ttl_ms/3`` in a background
        thread; ``lease.lost`` is set when it is lost. Releases on exit.
        """
        return Lease(self, name, ttl_ms=ttl_ms, owner=owner, wait=wait,
                     renew_every_ms=renew_every_ms)

    # -- tables -------------------------------------------------------------------------------

    def table_get(self, resource: str, key: TableKey) -> Row:
        return self._run(self._c_table_get(resource, key))

    def table_put(self, resource: str, key: TableKey, row: Mapping[str, Any], *, token: Token,
                  scope: Optional[str] = None, proof: Optional[str] = None,
                  idempotency_key: Optional[str] = None) -> WriteResult:
        return self._run(self._c_table_write("PUT", resource, key, row, token, scope, proof,
                                                idempotency_key))

    def table_patch(self, resource: str, key: TableKey, row: Mapping[str, Any], *, token: Token,
                    scope: Optional[str] = None, proof: Optional[str] = None,
                    idempotency_key: Optional[str] = None) -> WriteResult:
        return self._run(self._c_table_write("PATCH", resource, key, row, token, scope, proof,
                                                idempotency_key))

    def table_delete(self, resource: str, key: TableKey, *, token: Token,
                     scope: Optional[str] = None, proof: Optional[str] = None,
                     idempotency_key: Optional[str] = None) -> DeleteResult:
        return self._run(self._c_table_delete(resource, key, token, scope, proof,
                                                 idempotency_key))

    # -- admin --------------------------------------------------------------------------------

    def reset_fence(self, scope: str, *, to: Token, reason: str) -> AdminResult:
        """Lower a scope's fence to ``to`` (audited; needs ``admin``)."""
        return self._run(self._c_reset_fence(scope, to, reason))

    def reset_key(self, key: str, *, reason: str, to: Optional[Token] = None,
                  scope: Any = _UNSET) -> AdminResult:
        """Lower a key's fence and/or rebind its scope (``scope=None`` unbinds)."""
        return self._run(self._c_reset_key(key, to, scope, reason))

    def reset_row(self, resource: str, key: TableKey, *, reason: str, to: Optional[Token] = None,
                  scope: Any = _UNSET) -> AdminResult:
        return self._run(self._c_reset_row(resource, key, to, scope, reason))

    def rebind_keys(self, prefix: str, *, scope: Optional[str], reason: str) -> AdminResult:
        return self._run(self._c_rebind_keys(prefix, scope, reason))

    def rebind_table(self, resource: str, *, scope: Optional[str], reason: str) -> AdminResult:
        return self._run(self._c_rebind_table(resource, scope, reason))

    def retire_lock(self, name: str, *, reason: str) -> AdminResult:
        return self._run(self._c_retire(name, reason))

    def audit(self, limit: int = 100) -> List[AuditEntry]:
        """The audit log, newest first."""
        return self._run(self._c_audit(limit))

    def health(self) -> Dict[str, Any]:
        return self._run(self._c_health())

    def ready(self) -> Dict[str, Any]:
        """``/readyz``; ``Unavailable`` (with the reason in ``detail``) when not ready."""
        return self._run(self._c_ready())


def _retryable(e: BaseException) -> bool:
    return isinstance(e, (TransportError, ServerError))


class Lease:
    """A lease of the built-in lock service, renewed in a background thread.

    ``token`` (int) and ``scope`` (the lock's name) are what its writes carry; ``put``,
    ``delete``, ``batch``, ``claim`` and the ``table_*`` writes send them for you. ``lost`` is a
    ``threading.Event`` set when a renew is refused (409 ``lock-lost``, or any other definite
    refusal), when the lease's expiry passes without a successful renew (measured on this
    process's monotonic clock from just before the last successful grant or renew was sent),
    or when a write under it is refused 412. Once lost, its writes raise ``LeaseLost`` without
    sending anything. ``lost_reason`` holds the error that lost it.
    """

    def __init__(self, client: Client, name: str, *, ttl_ms: int = 10_000,
                 owner: Optional[str] = None, wait: Optional[float] = 0,
                 renew_every_ms: Optional[int] = None) -> None:
        if ttl_ms < 1:
            raise ValueError("ttl_ms must be at least 1")
        self.client = client
        self.name = name
        self.ttl_ms = int(ttl_ms)
        self.owner = check_owner(owner or default_owner())
        self.wait = wait
        self.renew_every_ms = renew_every_ms or max(1, self.ttl_ms // 3)
        self.lost = threading.Event()
        self.lost_reason: Optional[BaseException] = None
        self.grant: Optional[Grant] = None
        self._expiry: float = 0.0  # monotonic
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._lock = threading.Lock()
        self._released = False

    # -- state --------------------------------------------------------------------------------

    @property
    def token(self) -> int:
        if self.grant is None:
            raise RuntimeError("the lease is not acquired yet")
        return self.grant.token

    @property
    def scope(self) -> str:
        return self.grant.scope if self.grant is not None else self.name

    @property
    def remaining(self) -> float:
        """Seconds until the lease expires unless renewed (monotonic; 0 when lost or past)."""
        if self.lost.is_set():
            return 0.0
        return max(0.0, self._expiry - time.monotonic())

    def _mark_lost(self, reason: BaseException) -> None:
        with self._lock:
            if not self.lost.is_set():
                self.lost_reason = reason
                self.lost.set()
                log.warning("fencegate lease %r (token %s) lost: %s", self.name,
                            self.grant.token if self.grant else None, reason)

    def _check(self) -> None:
        """Raise ``LeaseLost`` if the lease is lost, released, or its expiry passed."""
        if self._released and not self.lost.is_set():
            raise LeaseLost(f"lease {self.name!r} was released", name=self.name,
                            token=self.grant.token if self.grant else None)
        if not self.lost.is_set() and self.grant is not None and time.monotonic() >= self._expiry:
            self._mark_lost(LeaseLost(f"lease {self.name!r} expired without a successful renew",
                                      name=self.name, token=self.token))
        if self.lost.is_set():
            err = LeaseLost(f"lease {self.name!r} (token {self.grant.token if self.grant else None}) "
                            f"is lost: {self.lost_reason}", name=self.name,
                            token=self.grant.token if self.grant else None, reason=self.lost_reason)
            raise err from (self.lost_reason if self.lost_reason is not err else None)

    # -- acquire / renew / release ------------------------------------------------------------

    def acquire(self) -> "Lease":
        if self.grant is not None:
            raise RuntimeError("a Lease is acquired once; take a new one with client.lease()")
        deadline = None if self.wait is None else time.monotonic() + max(0.0, self.wait)
        while True:
            sent = time.monotonic()
            try:
                grant = self.client.acquire(self.name, ttl_ms=self.ttl_ms, owner=self.owner)
                break
            except (LockHeld, TransportError, ServerError) as e:
                now = time.monotonic()
                if deadline is not None and now >= deadline:
                    raise
                if isinstance(e, LockHeld) and e.remaining_ms is not None:
                    pause = min(max(e.remaining_ms / 1000.0, 0.02), 1.0)
                else:
                    pause = 0.25
                pause *= random.uniform(0.8, 1.2)
                if deadline is not None:
                    pause = min(pause, max(0.0, deadline - now))
                time.sleep(pause)
        self.grant = grant
        self._expiry = sent + grant.ttl_ms / 1000.0
        self._thread = threading.Thread(target=self._renew_loop, name=f"fencegate-lease-{self.name}",
                                        daemon=True)
        self._thread.start()
        return self

    def _renew_loop(self) -> None:
        every = self.renew_every_ms / 1000.0
        retry = max(self.ttl_ms / 10000.0, 0.01)
        next_at = time.monotonic() + every
        # Wake for the next renew, or at the expiry if that comes first (a renew failing, or
        # renew_every_ms above the ttl): the lease is lost the moment it lapses.
        while not self._stop.wait(max(0.0, min(next_at, self._expiry) - time.monotonic())):
            if time.monotonic() >= self._expiry:
                self._mark_lost(LeaseLost(f"lease {self.name!r} expired without a successful renew",
                                          name=self.name, token=self.token))
                return
            if time.monotonic() < next_at:
                continue
            sent = time.monotonic()
            try:
                grant = self.client.renew(self.name, token=self.token, ttl_ms=self.ttl_ms)
            except FencegateError as e:
                if self._stop.is_set():
                    return
                if _retryable(e):
                    log.info("fencegate lease %r: renew failed, retrying: %s", self.name, e)
                    next_at = time.monotonic() + retry
                    continue
                self._mark_lost(e)
                return
            except Exception as e:  # pragma: no cover - a bug; do not die silently
                self._mark_lost(e)
                return
            self.grant = grant
            self._expiry = sent + grant.ttl_ms / 1000.0
            next_at = sent + every

    def renew(self) -> Grant:
        """Renew now (the background thread does this on its own)."""
        self._check()
        sent = time.monotonic()
        try:
            grant = self.client.renew(self.name, token=self.token, ttl_ms=self.ttl_ms)
        except FencegateError as e:
            if not _retryable(e):
                self._mark_lost(e)
            raise
        self.grant = grant
        self._expiry = sent + grant.ttl_ms / 1000.0
        return grant

    def release(self) -> None:
        """Stop renewing and release the lock. Releasing a lost lease is not an error."""
        if self._released or self.grant is None:
            return
        self._released = True
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
        try:
            self.client.release(self.name, token=self.token)
        except LockLost as e:
            self._mark_lost(e)

    def __enter__(self) -> "Lease":
        if self.grant is not None and not self._released:
            return self  # `with client.lease(...).acquire() as lease:`
        return self.acquire()

    def __exit__(self, exc_type: Optional[Type[BaseException]], exc: Optional[BaseException],
                 tb: Optional[TracebackType]) -> None:
        try:
            self.release()
        except FencegateError:
            if exc is None:
                raise
            log.warning("fencegate lease %r: release failed", self.name, exc_info=True)

    # -- writes under the lease -----------------------------------------------------------------

    def _write(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        self._check()
        try:
            return fn(*args, token=self.token, scope=self.scope, **kwargs)
        except StaleToken as e:
            self._mark_lost(e)
            raise

    def put(self, key: str, value: Any, *, proof: Optional[str] = None,
            idempotency_key: Optional[str] = None) -> WriteResult:
        return self._write(self.client.put, key, value, proof=proof,
                           idempotency_key=idempotency_key)

    def delete(self, key: str, *, proof: Optional[str] = None,
               idempotency_key: Optional[str] = None) -> DeleteResult:
        return self._write(self.client.delete, key, proof=proof,
                           idempotency_key=idempotency_key)

    def batch(self, ops: Iterable[Op], *, proof: Optional[str] = None,
              idempotency_key: Optional[str] = None) -> BatchResult:
        return self._write(self.client.batch, ops, proof=proof,
                           idempotency_key=idempotency_key)

    def claim(self, *, proof: Optional[str] = None,
              idempotency_key: Optional[str] = None) -> Fence:
        self._check()
        try:
            return self.client.claim(self.scope, token=self.token, proof=proof,
                                     idempotency_key=idempotency_key)
        except StaleToken as e:
            self._mark_lost(e)
            raise

    def get(self, key: str) -> Entry:
        """A read (no token is needed; allowed on a lost lease too)."""
        return self.client.get(key)

    def table_put(self, resource: str, key: TableKey, row: Mapping[str, Any], *,
                  proof: Optional[str] = None,
                  idempotency_key: Optional[str] = None) -> WriteResult:
        return self._write(self.client.table_put, resource, key, row, proof=proof,
                           idempotency_key=idempotency_key)

    def table_patch(self, resource: str, key: TableKey, row: Mapping[str, Any], *,
                    proof: Optional[str] = None,
                    idempotency_key: Optional[str] = None) -> WriteResult:
        return self._write(self.client.table_patch, resource, key, row, proof=proof,
                           idempotency_key=idempotency_key)

    def table_delete(self, resource: str, key: TableKey, *,
                     proof: Optional[str] = None,
                     idempotency_key: Optional[str] = None) -> DeleteResult:
        return self._write(self.client.table_delete, resource, key, proof=proof,
                           idempotency_key=idempotency_key)

    def __repr__(self) -> str:
        tok = self.grant.token if self.grant else None
        return f"<Lease {self.name!r} token={tok} lost={self.lost.is_set()}>"
