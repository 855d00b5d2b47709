"""What the sync and async clients share: how each call is spelled on the wire, and how an
answer becomes a result or a typed error. Neither client holds logic of its own beyond I/O."""

from __future__ import annotations

import json as _json
import random
import secrets
import ssl
import time
from dataclasses import dataclass, replace
from typing import (Any, Generic, TypeVar, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple,
                    Union)
from urllib.parse import quote

import httpx

from ._errors import FencegateError, TransportError, Unavailable, error_class
from ._models import (AdminResult, AuditEntry, BatchResult, DeleteResult, Entry, Fence, Grant,
                      Holder, Released, Row, WriteResult)
from ._tokens import Token, token_str

__all__ = ["Signer", "TableKey", "Op", "ops"]

Signer = Callable[[str, int], str]
"""``signer(scope, token) -> X-Fencing-Proof``, e.g. ``functools.partial(sign_hmac, secret)``."""

TableKey = Union[str, Sequence[Any]]
Op = Dict[str, Any]

_UNSET: Any = object()
DEFAULT_TIMEOUT = 30.0
DEFAULT_RETRIES = 2
"""How many times a keyed write is sent again after a 503 with ``Retry-After`` or a lost
answer (a connection error), within the client's timeout."""


def new_idempotency_key() -> str:
    """A fresh ``Idempotency-Key``: 128 random bits from the OS's CSPRNG, as 32 hex digits."""
    return secrets.token_hex(16)


def check_idempotency_key(key: str) -> str:
    # The server's rule (1..=255 bytes of visible ASCII): refused here, before anything is sent.
    if not isinstance(key, str) or not 1 <= len(key) <= 255 or \
            any(not 0x21 <= ord(c) <= 0x7E for c in key):
        raise ValueError("an idempotency_key is 1..=255 characters of visible ASCII")
    return key


def segment(name: str) -> str:
    """A key, scope or lock name as one path segment (and as ``X-Fencing-Scope``)."""
    if not isinstance(name, str):
        raise TypeError(f"a key, scope or lock name is a str, not {type(name).__name__}")
    if name == "":
        raise ValueError("a key, scope or lock name must not be empty")
    return quote(name, safe="")


def table_key(key: TableKey) -> str:
    """A table row's key: a sequence of the key columns' values (each encoded, joined by
    ``,``), or a ``str`` that is already that joined form (``"acme,42"``)."""
    if isinstance(key, str):
        if key == "":
            raise ValueError("a row key must not be empty")
        return quote(key, safe=",")
    parts = list(key)
    if not parts:
        raise ValueError("a row key needs at least one column value")
    return ",".join(quote(str(p), safe="") for p in parts)


class ops:
    """Batch operations for ``batch()``: ``ops.put("a", 1)``, ``ops.delete("b")``,
    ``ops.table_put("orders", ("acme", 42), {...})``."""

    @staticmethod
    def put(key: str, value: Any) -> Op:
        return {"op": "put", "key": key, "value": value}

    @staticmethod
    def delete(key: str) -> Op:
        return {"op": "delete", "key": key}

    @staticmethod
    def table_put(resource: str, key: TableKey, row: Mapping[str, Any]) -> Op:
        return {"op": "put", "resource": resource, "key": _batch_row_key(key), "row": dict(row)}

    @staticmethod
    def table_patch(resource: str, key: TableKey, row: Mapping[str, Any]) -> Op:
        return {"op": "patch", "resource": resource, "key": _batch_row_key(key), "row": dict(row)}

    @staticmethod
    def table_delete(resource: str, key: TableKey) -> Op:
        return {"op": "delete", "resource": resource, "key": _batch_row_key(key)}


def _batch_row_key(key: TableKey) -> str:
    # In a batch body the row key is the same joined, percent-encoded form as in the URL.
    return table_key(key)


T = TypeVar("T")


@dataclass
class Call(Generic[T]):
    method: str
    path: str
    headers: Dict[str, str]
    body: Any  # _UNSET: no body
    parse: Callable[[httpx.Response], T]
    params: Optional[Dict[str, Any]] = None
    # Set on writes: sent as Idempotency-Key, and the same on every retry of this call.
    idempotency_key: Optional[str] = None

    def result(self, resp: httpx.Response) -> T:
        """The parsed answer; ``replayed`` set when the server replayed a kept outcome."""
        out = self.parse(resp)
        if resp.headers.get("idempotent-replayed", "").lower() == "true" and \
                hasattr(out, "replayed"):
            out = replace(out, replayed=True)  # type: ignore[type-var]
        return out


def retry_budget(timeout: Union[float, httpx.Timeout, None]) -> float:
    """Seconds within which a keyed write may be retried: the client's timeout."""
    if isinstance(timeout, httpx.Timeout):
        parts = [t for t in (timeout.connect, timeout.read, timeout.write, timeout.pool) if t]
        return max(parts) if parts else DEFAULT_TIMEOUT
    return float(timeout) if timeout else DEFAULT_TIMEOUT


def retry_pause(err: FencegateError, attempt: int, retries: int, deadline: float) -> Optional[float]:
    """How long to wait before retrying a keyed write that failed with ``err``, or ``None``
    when it must not be retried. Only a lost answer (the write may have landed) and a 503 whose
    ``Retry-After`` asks for it are retried; the key makes the retry safe, since the server
    answers a landed write's retry with its first outcome."""
    if attempt >= retries:
        return None
    if isinstance(err, Unavailable):
        if err.retry_after is None:
            return None
        pause = max(0.0, err.retry_after)
    elif isinstance(err, TransportError):
        pause = 0.1 * (2 ** attempt) * random.uniform(0.8, 1.2)
    else:
        return None
    if time.monotonic() + pause >= deadline:
        return None
    return pause


def ssl_config(verify: Union[bool, str, ssl.SSLContext], cacert: Optional[str],
               cert: Optional[Union[str, Tuple[str, str]]]) -> Union[bool, ssl.SSLContext]:
    """httpx's ``verify`` from the client's TLS options: ``verify=False`` turns checking off,
    ``cacert`` (or ``verify="path"``) trusts that PEM bundle instead of the system's roots,
    ``cert`` is a client certificate (a PEM file holding both, or ``(cert_file, key_file)``)."""
    if isinstance(verify, ssl.SSLContext):
        ctx = verify
    elif verify is False:
        if cert is None:
            return False
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    else:
        cafile = cacert if cacert is not None else (verify if isinstance(verify, str) else None)
        if cafile is None and cert is None:
            return True
        if cafile is not None:
            ctx = ssl.create_default_context(cafile=cafile)
        else:
            try:
                import certifi  # httpx's own dependency
                ctx = ssl.create_default_context(cafile=certifi.where())
            except ImportError:  # pragma: no cover
                ctx = ssl.create_default_context()
    if cert is not None:
        if isinstance(cert, str):
            ctx.load_cert_chain(cert)
        else:
            ctx.load_cert_chain(cert[0], cert[1])
    return ctx


def raise_for(resp: httpx.Response) -> None:
    """Raise the typed error of a non-2xx answer."""
    if 200 <= resp.status_code < 300:
        return
    body: Dict[str, Any] = {}
    try:
        decoded = resp.json()
        if isinstance(decoded, dict):
            body = decoded
    except (ValueError, UnicodeDecodeError):
        pass
    type_ = body.get("type") if isinstance(body.get("type"), str) else None
    slug = None
    if type_ is not None:
        slug = type_.rsplit("/", 1)[-1]
    cls = error_class(resp.status_code, slug)
    detail = body.get("detail") if body else (resp.text[:500] if resp.content else None)
    raise cls(status=resp.status_code, type=type_, title=body.get("title"), detail=detail,
              body=body, headers=dict(resp.headers))


def _json_of(resp: httpx.Response) -> Dict[str, Any]:
    v = resp.json()
    return v if isinstance(v, dict) else {"value": v}


class Api:
    """Call builders: every endpoint, once, for both clients."""

    def __init__(self, signer: Optional[Signer]) -> None:
        self._signer = signer

    # -- headers ------------------------------------------------------------------------------

    @staticmethod
    def _keyed(call: "Call[T]", idempotency_key: Optional[str]) -> "Call[T]":
        # One key per write: the caller's, else a fresh one, kept on the call for its retries.
        key = check_idempotency_key(idempotency_key) if idempotency_key is not None \
            else new_idempotency_key()
        call.headers["Idempotency-Key"] = key
        call.idempotency_key = key
        return call

    def _fencing(self, token: Token, scope: Optional[str], proof: Optional[str]) -> Dict[str, str]:
        t = token_str(token)
        h = {"X-Fencing-Token": t}
        if scope is not None:
            h["X-Fencing-Scope"] = segment(scope)
        if proof is None and self._signer is not None and scope is not None:
            proof = self._signer(scope, int(t))
        if proof is not None:
            h["X-Fencing-Proof"] = proof
        return h

    # -- kv -----------------------------------------------------------------------------------

    def _c_get(self, key: str) -> Call[Entry]:
        return Call("GET", f"/v1/kv/{segment(key)}", {}, _UNSET, lambda r: Entry.parse(r.json()))

    def _c_put(self, key: str, value: Any, token: Token, scope: Optional[str],
               proof: Optional[str], idempotency_key: Optional[str] = None) -> Call[WriteResult]:
        return self._keyed(Call("PUT", f"/v1/kv/{segment(key)}", self._fencing(token, scope, proof),
                                value, lambda r: WriteResult.parse(r.json(), r.status_code)),
                           idempotency_key)

    def _c_delete(self, key: str, token: Token, scope: Optional[str],
                  proof: Optional[str], idempotency_key: Optional[str] = None) -> Call[DeleteResult]:
        return self._keyed(Call("DELETE", f"/v1/kv/{segment(key)}",
                                self._fencing(token, scope, proof), _UNSET,
                                lambda r: DeleteResult.parse(r.json())), idempotency_key)

    def _c_batch(self, ops_: Iterable[Op], token: Token, scope: Optional[str],
                 proof: Optional[str], idempotency_key: Optional[str] = None) -> Call[BatchResult]:
        return self._keyed(Call("POST", "/v1/batch", self._fencing(token, scope, proof),
                                {"ops": list(ops_)}, lambda r: BatchResult.parse(r.json())),
                           idempotency_key)

    # -- fences -------------------------------------------------------------------------------

    def _c_claim(self, scope: str, token: Token, proof: Optional[str],
                 idempotency_key: Optional[str] = None) -> Call[Fence]:
        return self._keyed(Call("POST", f"/v1/fences/{segment(scope)}",
                                self._fencing(token, scope, proof), _UNSET,
                                lambda r: Fence.parse(r.json(), r.status_code)), idempotency_key)

    def _c_get_fence(self, scope: str) -> Call[Fence]:
        return Call("GET", f"/v1/fences/{segment(scope)}", {}, _UNSET,
                    lambda r: Fence.parse(r.json()))

    # -- locks --------------------------------------------------------------------------------

    def _c_acquire(self, name: str, ttl_ms: int, owner: str) -> Call[Grant]:
        return Call("POST", f"/v1/locks/{segment(name)}", {}, {"owner": owner, "ttl_ms": int(ttl_ms)},
                    lambda r: Grant.parse(r.json()))

    def _c_renew(self, name: str, token: Token, ttl_ms: int) -> Call[Grant]:
        return Call("POST", f"/v1/locks/{segment(name)}/renew", {"X-Fencing-Token": token_str(token)},
                    {"ttl_ms": int(ttl_ms)}, lambda r: Grant.parse(r.json()))

    def _c_release(self, name: str, token: Token) -> Call[Released]:
        return Call("DELETE", f"/v1/locks/{segment(name)}", {"X-Fencing-Token": token_str(token)},
                    _UNSET, lambda r: Released.parse(r.json()))

    def _c_holder(self, name: str) -> Call[Holder]:
        return Call("GET", f"/v1/locks/{segment(name)}", {}, _UNSET,
                    lambda r: Holder.parse(r.json()))

    # -- tables -------------------------------------------------------------------------------

    def _table_path(self, resource: str, key: TableKey) -> str:
        return f"/v1/tables/{segment(resource)}/{table_key(key)}"

    def _c_table_get(self, resource: str, key: TableKey) -> Call[Row]:
        return Call("GET", self._table_path(resource, key), {}, _UNSET, lambda r: Row.parse(r.json()))

    def _c_table_write(self, method: str, resource: str, key: TableKey, row: Mapping[str, Any],
                       token: Token, scope: Optional[str], proof: Optional[str],
                       idempotency_key: Optional[str] = None) -> Call[WriteResult]:
        return self._keyed(Call(method, self._table_path(resource, key),
                                self._fencing(token, scope, proof), dict(row),
                                lambda r: WriteResult.parse(r.json(), r.status_code)),
                           idempotency_key)

    def _c_table_delete(self, resource: str, key: TableKey, token: Token, scope: Optional[str],
                        proof: Optional[str], idempotency_key: Optional[str] = None) -> Call[DeleteResult]:
        return self._keyed(Call("DELETE", self._table_path(resource, key),
                                self._fencing(token, scope, proof), _UNSET,
                                lambda r: DeleteResult.parse(r.json())), idempotency_key)

    # -- admin --------------------------------------------------------------------------------

    @staticmethod
    def _reset_body(to: Optional[Token], scope: Any, reason: str) -> Dict[str, Any]:
        b: Dict[str, Any] = {"reason": reason}
        if to is not None:
            b["to"] = token_str(to)
        if scope is not _UNSET:
            b["scope"] = scope
        return b

    def _c_reset_fence(self, scope: str, to: Token, reason: str) -> Call[AdminResult]:
        return Call("POST", f"/v1/admin/fences/{segment(scope)}/reset", {},
                    self._reset_body(to, _UNSET, reason), lambda r: AdminResult.parse(r.json()))

    def _c_reset_key(self, key: str, to: Optional[Token], scope: Any, reason: str) -> Call[AdminResult]:
        return Call("POST", f"/v1/admin/kv/{segment(key)}/reset", {},
                    self._reset_body(to, scope, reason), lambda r: AdminResult.parse(r.json()))

    def _c_reset_row(self, resource: str, key: TableKey, to: Optional[Token], scope: Any,
                     reason: str) -> Call[AdminResult]:
        return Call("POST", f"/v1/admin/tables/{segment(resource)}/{table_key(key)}/reset", {},
                    self._reset_body(to, scope, reason), lambda r: AdminResult.parse(r.json()))

    def _c_rebind_keys(self, prefix: str, scope: Optional[str], reason: str) -> Call[AdminResult]:
        return Call("POST", "/v1/admin/kv/rebind", {},
                    {"prefix": prefix, "scope": scope, "reason": reason},
                    lambda r: AdminResult.parse(r.json()))

    def _c_rebind_table(self, resource: str, scope: Optional[str], reason: str) -> Call[AdminResult]:
        return Call("POST", f"/v1/admin/tables/{segment(resource)}/rebind", {},
                    {"scope": scope, "reason": reason}, lambda r: AdminResult.parse(r.json()))

    def _c_retire(self, name: str, reason: str) -> Call[AdminResult]:
        return Call("POST", f"/v1/admin/locks/{segment(name)}/retire", {}, {"reason": reason},
                    lambda r: AdminResult.parse(r.json()))

    def _c_audit(self, limit: int) -> Call[List[AuditEntry]]:
        return Call("GET", "/v1/admin/audit", {}, _UNSET,
                    lambda r: [AuditEntry.parse(e) for e in r.json().get("entries", [])],
                    params={"limit": int(limit)})

    def _c_health(self) -> Call[Dict[str, Any]]:
        return Call("GET", "/healthz", {}, _UNSET, _json_of)

    def _c_ready(self) -> Call[Dict[str, Any]]:
        return Call("GET", "/readyz", {}, _UNSET, _json_of)


def encode_body(body: Any) -> Tuple[Optional[bytes], Dict[str, str]]:
    if body is _UNSET:
        return None, {}
    data = _json.dumps(body, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    return data.encode("utf-8"), {"Content-Type": "application/json"}


def base_headers(api_key: Optional[str], extra: Optional[Mapping[str, str]]) -> Dict[str, str]:
    from . import __version__
    h = {"User-Agent": f"fencegate-python/{__version__}", "Accept": "application/json"}
    if api_key:
        h["Authorization"] = f"Bearer {api_key}"
    if extra:
        h.update(extra)
    return h


def check_owner(owner: str) -> str:
    if not owner or any(ord(c) < 0x20 or ord(c) == 0x7F for c in owner):
        raise ValueError("a lease owner is 1..=256 bytes with no control characters")
    return owner


def default_owner() -> str:
    import os
    import socket
    import threading
    return f"{socket.gethostname()}:{os.getpid()}:{threading.get_ident() % 100000}"


List_ = List  # re-export for type hints elsewhere
