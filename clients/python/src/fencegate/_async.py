"""The asyncio client and its lease: the one source of both clients.

``_sync.py`` (``Client``, ``Lease``) is generated from this file by ``tools/gen_sync.py``
(``async def`` -> ``def``, ``await x`` -> ``x``, ``AsyncClient`` -> ``Client``, ... : the rules
are listed there), and a test fails when it differs from a fresh generation. Edit this file,
then run ``python3 tools/gen_sync.py``. The one part that differs genuinely, how a lease is
kept renewed (an asyncio task here, a thread there), lives in ``_renew_async.py`` and
``_renew_sync.py``, written by hand.
"""

from __future__ import annotations

import logging
import random
import ssl
import time
from types import TracebackType
from typing import Any, Awaitable, Callable, Dict, Iterable, List, Mapping, Optional, Tuple, Type, Union

import httpx

from ._core import (DEFAULT_RETRIES, DEFAULT_TIMEOUT, _UNSET, Api, Call, T, Op, Signer, TableKey,
                    base_headers, check_owner, default_owner, encode_body, raise_for, retry_budget,
                    retry_pause, ssl_config)
from ._errors import (FencegateError, LeaseLost, LockHeld, LockLost, NotFound, ServerError,
                      StaleToken, TransportError)
from ._models import (AdminResult, AuditEntry, BatchResult, DeleteResult, Entry, Fence, Grant,
                      Holder, Released, Row, WriteResult)
from ._renew_async import Event, Renewer, sleep
from ._tokens import Token

log = logging.getLogger("fencegate")


class AsyncClient(Api):
    """An asyncio client of one fencegate server: the API of ``Client``, awaited.

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
    Close it with ``await client.aclose()`` (or use ``async with``).
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
        transport: Optional[httpx.AsyncBaseTransport] = None,
    ) -> None:
        super().__init__(signer)
        self.url = url.rstrip("/")
        if retries < 0:
            raise ValueError("retries must be 0 or more")
        self._retries = int(retries)
        self._retry_budget = retry_budget(timeout)
        self._http = httpx.AsyncClient(
            base_url=self.url,
            headers=base_headers(api_key, headers),
            verify=ssl_config(verify, cacert, cert),
            timeout=timeout,
            transport=transport,
        )

    @classmethod
    def from_env(cls, **kwargs: Any) -> "AsyncClient":
        """``FENCEGATE_URL`` (default ``http://127.0.0.1:8080``), ``FENCEGATE_API_KEY``,
        ``FENCEGATE_CACERT``, as the command line reads them."""
        import os
        kwargs.setdefault("api_key", os.environ.get("FENCEGATE_API_KEY") or None)
        if os.environ.get("FENCEGATE_CACERT"):
            kwargs.setdefault("cacert", os.environ["FENCEGATE_CACERT"])
        return cls(os.environ.get("FENCEGATE_URL") or "http://127.0.0.1:8080", **kwargs)

    # -- plumbing -----------------------------------------------------------------------------

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()

    async def request(self, method: str, path: str, *, headers: Optional[Mapping[str, str]] = None,
                      json: Any = _UNSET,
                      params: Optional[Mapping[str, Any]] = None) -> httpx.Response:
        """Any request, as sent (no token checks): the answer on 2xx, else its typed error."""
        content, h = encode_body(json)
        h.update(headers or {})
        try:
            resp = await self._http.request(method, path, content=content, headers=h, params=params)
        except httpx.TransportError as e:
            raise TransportError(f"{method} {self.url}{path}: {e!r}") from e
        raise_for(resp)
        return resp

    async def _run(self, call: Call[T]) -> T:
        if call.idempotency_key is None:
            resp = await self.request(call.method, call.path, headers=call.headers, json=call.body,
                                      params=call.params)
            return call.result(resp)
        # A keyed write: its retries carry the same Idempotency-Key (it is in call.headers).
        deadline = time.monotonic() + self._retry_budget
        attempt = 0
        while True:
            try:
                resp = await self.request(call.method, call.path, headers=call.headers,
                                          json=call.body, params=call.params)
                return call.result(resp)
            except FencegateError as e:
                pause = retry_pause(e, attempt, self._retries, deadline)
                if pause is None:
                    raise
                log.info("fencegate: retrying %s %s with the same Idempotency-Key: %s",
                         call.method, call.path, e)
                attempt += 1
                await sleep(pause)

    # -- kv -----------------------------------------------------------------------------------

    async def get(self, key: str) -> Entry:
        """The key's value and fence; ``NotFound`` if absent or deleted."""
        return await self._run(self._c_get(key))

    async def put(self, key: str, value: Any, *, token: Token, scope: Optional[str] = None,
                  proof: Optional[str] = None,
                  idempotency_key: Optional[str] = None) -> WriteResult:
        """Write ``value`` (any JSON value) under ``token`` (and ``scope``: the lock's name)."""
        return await self._run(self._c_put(key, value, token, scope, proof, idempotency_key))

    async def delete(self, key: str, *, token: Token, scope: Optional[str] = None,
                     proof: Optional[str] = None,
                     idempotency_key: Optional[str] = None) -> DeleteResult:
        """Delete the key; its tombstone keeps the fence."""
        return await self._run(self._c_delete(key, token, scope, proof, idempotency_key))

    async def batch(self, ops: Iterable[Op], *, token: Token, scope: Optional[str] = None,
                    proof: Optional[str] = None,
                    idempotency_key: Optional[str] = None) -> BatchResult:
        """Apply ``ops`` (see ``fencegate.ops``) all or nothing under one token."""
        return await self._run(self._c_batch(ops, token, scope, proof, idempotency_key))

    # -- fences -------------------------------------------------------------------------------

    async def claim(self, scope: str, *, token: Token, proof: Optional[str] = None,
                    idempotency_key: Optional[str] = None) -> Fence:
        """Raise the scope's fence to ``token`` without writing data (a new holder exists)."""
        return await self._run(self._c_claim(scope, token, proof, idempotency_key))

    async def get_fence(self, scope: str) -> Fence:
        """The scope's fence; ``NotFound`` if it has none."""
        return await self._run(self._c_get_fence(scope))

    # -- locks --------------------------------------------------------------------------------

    async def acquire(self, name: str, *, ttl_ms: int = 10_000, owner: Optional[str] = None) -> Grant:
        """Take the built-in lock once (``LockHeld`` if held). Prefer ``lease()``."""
        return await self._run(self._c_acquire(name, ttl_ms, check_owner(owner or default_owner())))

    async def renew(self, name: str, *, token: Token, ttl_ms: int = 10_000) -> Grant:
        return await self._run(self._c_renew(name, token, ttl_ms))

    async def release(self, name: str, *, token: Token) -> Released:
        return await self._run(self._c_release(name, token))

    async def holder(self, name: str) -> Optional[Holder]:
        """Who holds the lock (never its token), or ``None`` when it is free."""
        try:
            return await self._run(self._c_holder(name))
        except NotFound:
            return None

    def lease(self, name: str, ttl_ms: int = 10_000, owner: Optional[str] = None, *,
              wait: Optional[float] = 0, renew_every_ms: Optional[int] = None) -> "AsyncLease":
        """A lease on the built-in lock ``name``, taken on ``async with`` (or ``await lease.acquire()``).

        ``wait``: seconds to keep retrying while the lock is held (0: raise ``LockHeld`` at
        once; ``None``: wait for ever). While held, it renews every ``ttl_ms/3`` in the
        background (an asyncio task); ``lease.lost`` (an ``asyncio.Event``) is set when it is
        lost. Releases on exit.
        """
        return AsyncLease(self, name, ttl_ms=ttl_ms, owner=owner, wait=wait,
                          renew_every_ms=renew_every_ms)

    # -- tables -------------------------------------------------------------------------------

    async def table_get(self, resource: str, key: TableKey) -> Row:
        return await self._run(self._c_table_get(resource, key))

    async def table_put(self, resource: str, key: TableKey, row: Mapping[str, Any], *, token: Token,
                        scope: Optional[str] = None, proof: Optional[str] = None,
                        idempotency_key: Optional[str] = None) -> WriteResult:
        return await self._run(self._c_table_write("PUT", resource, key, row, token, scope, proof,
                                                   idempotency_key))

    async def table_patch(self, resource: str, key: TableKey, row: Mapping[str, Any], *, token: Token,
                          scope: Optional[str] = None, proof: Optional[str] = None,
                          idempotency_key: Optional[str] = None) -> WriteResult:
        return await self._run(self._c_table_write("PATCH", resource, key, row, token, scope, proof,
                                                   idempotency_key))

    async def table_delete(self, resource: str, key: TableKey, *, token: Token,
                           scope: Optional[str] = None, proof: Optional[str] = None,
                           idempotency_key: Optional[str] = None) -> DeleteResult:
        return await self._run(self._c_table_delete(resource, key, token, scope, proof,
                                                    idempotency_key))

    # -- admin --------------------------------------------------------------------------------

    async def reset_fence(self, scope: str, *, to: Token, reason: str) -> AdminResult:
        """Lower a scope's fence to ``to`` (audited; needs ``admin``)."""
        return await self._run(self._c_reset_fence(scope, to, reason))

    async def reset_key(self, key: str, *, reason: str, to: Optional[Token] = None,
                        scope: Any = _UNSET) -> AdminResult:
        """Lower a key's fence and/or rebind its scope (``scope=None`` unbinds)."""
        return await self._run(self._c_reset_key(key, to, scope, reason))

    async def reset_row(self, resource: str, key: TableKey, *, reason: str, to: Optional[Token] = None,
                        scope: Any = _UNSET) -> AdminResult:
        return await self._run(self._c_reset_row(resource, key, to, scope, reason))

    async def rebind_keys(self, prefix: str, *, scope: Optional[str], reason: str) -> AdminResult:
        return await self._run(self._c_rebind_keys(prefix, scope, reason))

    async def rebind_table(self, resource: str, *, scope: Optional[str], reason: str) -> AdminResult:
        return await self._run(self._c_rebind_table(resource, scope, reason))

    async def retire_lock(self, name: str, *, reason: str) -> AdminResult:
        return await self._run(self._c_retire(name, reason))

    async def audit(self, limit: int = 100) -> List[AuditEntry]:
        """The audit log, newest first."""
        return await self._run(self._c_audit(limit))

    async def health(self) -> Dict[str, Any]:
        return await self._run(self._c_health())

    async def ready(self) -> Dict[str, Any]:
        """``/readyz``; ``Unavailable`` (with the reason in ``detail``) when not ready."""
        return await self._run(self._c_ready())


def _retryable(e: BaseException) -> bool:
    return isinstance(e, (TransportError, ServerError))


class AsyncLease:
    """A lease of the built-in lock service, renewed in the background.
    (an asyncio task: create the lease inside the event loop that uses it)

    ``token`` (int) and ``scope`` (the lock's name) are what its writes carry; ``put``,
    ``delete``, ``batch``, ``claim`` and the ``table_*`` writes send them for you. ``lost`` is
    an ``asyncio.Event`` set when a renew is refused (409 ``lock-lost``, or any other definite
    refusal), when the lease's expiry passes without a successful renew (measured on this
    process's monotonic clock from just before the last successful grant or renew was sent),
    or when a write under it is refused 412. Once lost, its writes raise ``LeaseLost`` without
    sending anything. ``lost_reason`` holds the error that lost it.
    """

    def __init__(self, client: AsyncClient, name: str, *, ttl_ms: int = 10_000,
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
        self.lost = Event()
        self.lost_reason: Optional[BaseException] = None
        self.grant: Optional[Grant] = None
        self._expiry: float = 0.0  # monotonic
        self._renewer = Renewer(name)
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
        # The renewer and the caller may both get here (two threads, for the blocking lease).
        with self._renewer.lock:
            if not self.lost.is_set():
                self.lost_reason = reason
                self.lost.set()
                log.warning("fencegate lease %r (token %s) lost: %s", self.name,
                            self.grant.token if self.grant else None, reason)

    def _check(self) -> None:
        """Raise ``LeaseLost`` if the lease is lost, released, or its expiry passed."""
        tok = self.grant.token if self.grant else None
        if self._released and not self.lost.is_set():
            raise LeaseLost(f"lease {self.name!r} was released", name=self.name, token=tok)
        if not self.lost.is_set() and self.grant is not None and time.monotonic() >= self._expiry:
            self._mark_lost(LeaseLost(f"lease {self.name!r} expired without a successful renew",
                                      name=self.name, token=tok))
        if self.lost.is_set():
            raise LeaseLost(f"lease {self.name!r} (token {tok}) is lost: {self.lost_reason}",
                            name=self.name, token=tok, reason=self.lost_reason) from self.lost_reason

    # -- acquire / renew / release ------------------------------------------------------------

    async def acquire(self) -> "AsyncLease":
        if self.grant is not None:
            raise RuntimeError("a lease is acquired once; take a new one with client.lease()")
        deadline = None if self.wait is None else time.monotonic() + max(0.0, self.wait)
        while True:
            sent = time.monotonic()
            try:
                grant = await self.client.acquire(self.name, ttl_ms=self.ttl_ms, owner=self.owner)
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
                await sleep(pause)
        self.grant = grant
        self._expiry = sent + grant.ttl_ms / 1000.0
        self._renewer.start(self._renew_loop)
        return self

    async def _renew_loop(self) -> None:
        every = self.renew_every_ms / 1000.0
        retry = max(self.ttl_ms / 10000.0, 0.01)
        next_at = time.monotonic() + every
        # Wake for the next renew, or at the expiry if that comes first (a renew failing, or
        # renew_every_ms above the ttl): the lease is lost the moment it lapses.
        while not await self._renewer.wait(max(0.0, min(next_at, self._expiry) - time.monotonic())):
            if time.monotonic() >= self._expiry:
                self._mark_lost(LeaseLost(f"lease {self.name!r} expired without a successful renew",
                                          name=self.name, token=self.token))
                return
            if time.monotonic() < next_at:
                continue
            sent = time.monotonic()
            try:
                grant = await self.client.renew(self.name, token=self.token, ttl_ms=self.ttl_ms)
            except FencegateError as e:
                if self._renewer.stopped:
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

    async def renew(self) -> Grant:
        """Renew now (the background renewer does this on its own)."""
        self._check()
        sent = time.monotonic()
        try:
            grant = await self.client.renew(self.name, token=self.token, ttl_ms=self.ttl_ms)
        except FencegateError as e:
            if not _retryable(e):
                self._mark_lost(e)
            raise
        self.grant = grant
        self._expiry = sent + grant.ttl_ms / 1000.0
        return grant

    async def release(self) -> None:
        """Stop renewing and release the lock. Releasing a lost lease is not an error."""
        if self._released or self.grant is None:
            return
        self._released = True
        await self._renewer.stop()
        try:
            await self.client.release(self.name, token=self.token)
        except LockLost as e:
            self._mark_lost(e)

    async def __aenter__(self) -> "AsyncLease":
        if self.grant is not None and not self._released:
            return self  # `async with await client.lease(...).acquire() as lease:`
        return await self.acquire()

    async def __aexit__(self, exc_type: Optional[Type[BaseException]], exc: Optional[BaseException],
                        tb: Optional[TracebackType]) -> None:
        try:
            await self.release()
        except FencegateError:
            if exc is None:
                raise
            log.warning("fencegate lease %r: release failed", self.name, exc_info=True)

    # -- writes under the lease -----------------------------------------------------------------

    async def _write(self, fn: Callable[..., Awaitable[T]], *args: Any, **kwargs: Any) -> T:
        self._check()
        try:
            return await fn(*args, token=self.token, scope=self.scope, **kwargs)
        except StaleToken as e:
            self._mark_lost(e)
            raise

    async def put(self, key: str, value: Any, *, proof: Optional[str] = None,
                  idempotency_key: Optional[str] = None) -> WriteResult:
        return await self._write(self.client.put, key, value, proof=proof,
                                 idempotency_key=idempotency_key)

    async def delete(self, key: str, *, proof: Optional[str] = None,
                     idempotency_key: Optional[str] = None) -> DeleteResult:
        return await self._write(self.client.delete, key, proof=proof,
                                 idempotency_key=idempotency_key)

    async def batch(self, ops: Iterable[Op], *, proof: Optional[str] = None,
                    idempotency_key: Optional[str] = None) -> BatchResult:
        return await self._write(self.client.batch, ops, proof=proof,
                                 idempotency_key=idempotency_key)

    async def claim(self, *, proof: Optional[str] = None,
                    idempotency_key: Optional[str] = None) -> Fence:
        self._check()
        try:
            return await self.client.claim(self.scope, token=self.token, proof=proof,
                                           idempotency_key=idempotency_key)
        except StaleToken as e:
            self._mark_lost(e)
            raise

    async def get(self, key: str) -> Entry:
        """A read (no token is needed; allowed on a lost lease too)."""
        return await self.client.get(key)

    async def table_put(self, resource: str, key: TableKey, row: Mapping[str, Any], *,
                        proof: Optional[str] = None,
                        idempotency_key: Optional[str] = None) -> WriteResult:
        return await self._write(self.client.table_put, resource, key, row, proof=proof,
                                 idempotency_key=idempotency_key)

    async def table_patch(self, resource: str, key: TableKey, row: Mapping[str, Any], *,
                          proof: Optional[str] = None,
                          idempotency_key: Optional[str] = None) -> WriteResult:
        return await self._write(self.client.table_patch, resource, key, row, proof=proof,
                                 idempotency_key=idempotency_key)

    async def table_delete(self, resource: str, key: TableKey, *, proof: Optional[str] = None,
                           idempotency_key: Optional[str] = None) -> DeleteResult:
        return await self._write(self.client.table_delete, resource, key, proof=proof,
                                 idempotency_key=idempotency_key)

    def __repr__(self) -> str:
        tok = self.grant.token if self.grant else None
        return f"<AsyncLease {self.name!r} token={tok} lost={self.lost.is_set()}>"
