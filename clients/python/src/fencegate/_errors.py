"""Typed errors: one class per RFC 9457 problem type fencegate sends."""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Type

PROBLEM_BASE = "https://fencegate.dev/problems/"


def _int(v: Any) -> Optional[int]:
    """A token or counter from a problem body: strings of decimals (tokens) or JSON integers."""
    if v is None:
        return None
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v
    if isinstance(v, str) and v.isascii() and v.isdigit():
        return int(v)
    return None


class _Named:
    """What a problem is about: the ``key``, the ``scope`` and, for a table row, the ``resource``."""
    body: Dict[str, Any]

    @property
    def key(self) -> Optional[str]:
        return self.body.get("key")

    @property
    def scope(self) -> Optional[str]:
        return self.body.get("scope")

    @property
    def resource(self) -> Optional[str]:
        return self.body.get("resource")


class _Tokens:
    """The token a refused write ``presented`` and the fence (``current``) it ran into."""
    body: Dict[str, Any]

    @property
    def presented(self) -> Optional[int]:
        return _int(self.body.get("presented_token"))

    @property
    def current(self) -> Optional[int]:
        return _int(self.body.get("current_token"))


class _Holder:
    """Who holds a lock (``holder``) and for how long (``remaining_ms``)."""
    body: Dict[str, Any]

    @property
    def holder(self) -> Optional[str]:
        return self.body.get("holder")

    @property
    def remaining_ms(self) -> Optional[int]:
        return _int(self.body.get("remaining_ms"))


class FencegateError(Exception):
    """Base of every error this library raises.

    For an answer from the server: ``status`` (HTTP status), ``type`` (the problem's type URI),
    ``slug`` (its last segment, e.g. ``"stale-token"``), ``title``, ``detail`` and ``body`` (the
    whole decoded problem object, or ``{}`` when the body was not JSON). Errors raised without a
    server answer (``LeaseLost``, ``TransportError``) have ``status`` ``None``.
    """

    slug: Optional[str] = None  # the problem type this class stands for; None for bases

    def __init__(
        self,
        message: Optional[str] = None,
        *,
        status: Optional[int] = None,
        type: Optional[str] = None,
        title: Optional[str] = None,
        detail: Optional[str] = None,
        body: Optional[Mapping[str, Any]] = None,
        headers: Optional[Mapping[str, str]] = None,
    ) -> None:
        self.status = status
        self.type = type
        self.title = title
        self.detail = detail
        self.body: Dict[str, Any] = dict(body or {})
        self.headers: Dict[str, str] = {k.lower(): v for k, v in (headers or {}).items()}
        if type is not None:
            self.slug = type[len(PROBLEM_BASE):] if type.startswith(PROBLEM_BASE) else type.rsplit("/", 1)[-1]
        if message is None:
            parts = []
            if status is not None:
                parts.append(str(status))
            if type is not None:
                parts.append(type.rsplit("/", 1)[-1])
            head = " ".join(parts)
            text = detail or title or ""
            message = f"{head}: {text}" if head and text else (head or text or self.__class__.__name__)
        super().__init__(message)

    @property
    def request_id(self) -> Optional[str]:
        """The ``X-Request-Id`` of the refused request (what fencegate logged), when known."""
        return self.headers.get("x-request-id")


class TransportError(FencegateError):
    """No answer: the connection failed or timed out. The outcome of a write is unknown;
    retrying it with the same token is safe (a fenced write is idempotent under its token)."""


class FencingError(FencegateError):
    """A write (or a lease) refused for a fencing reason: a newer holder exists, the token or
    its proof is not acceptable under this scope, or the key belongs to another scope."""


class LeaseLost(FencingError):
    """Raised, without sending anything, by a write through a lease that is known to be lost
    (a renew failed, its expiry passed without a renew, or a write under it was refused 412).
    ``reason`` says which; ``__cause__`` is the error that lost it, when there was one."""

    def __init__(self, message: str, *, name: str = "", token: Optional[int] = None,
                 reason: Optional[BaseException] = None) -> None:
        super().__init__(message)
        self.name = name
        self.token = token
        self.reason = reason


# ---- by status ------------------------------------------------------------------------------

class BadRequest(FencegateError):
    """400: the request is malformed."""


class Unauthorized(FencegateError):
    """401 ``unauthenticated``: no valid credential (missing, unknown, expired, badly signed)."""
    slug = "unauthenticated"


Unauthenticated = Unauthorized


class Forbidden(FencegateError):
    """403 ``forbidden``: the credential lacks ``right`` on the name (``key``, ``scope``,
    ``lock`` or ``resource``)."""
    slug = "forbidden"

    @property
    def right(self) -> Optional[str]:
        return self.body.get("right")

    @property
    def name(self) -> Optional[str]:
        for f in ("key", "scope", "lock", "resource"):
            v = self.body.get(f)
            if isinstance(v, str):
                return v
        return None


class NotFound(FencegateError):
    """404 ``not-found``: an unknown route, an absent key, fence, lock, row or resource."""
    slug = "not-found"


class MethodNotAllowed(FencegateError):
    slug = "method-not-allowed"


class BodyTimeout(FencegateError):
    slug = "body-timeout"


class Conflict(FencegateError):
    """409: a conflict with the state of a lock, a scope or a binding."""


class PreconditionFailed(FencingError):
    """412: base of ``StaleToken``."""


class PayloadTooLarge(FencegateError):
    slug = "payload-too-large"


class UnsupportedMediaType(FencegateError):
    slug = "unsupported-media-type"


class MisdirectedRequest(FencegateError):
    slug = "misdirected-request"


class Unprocessable(FencegateError):
    """422: a well-formed request whose token, proof or value fencegate refuses."""


class MissingToken(FencegateError):
    """428 ``missing-token``: a write without a token."""
    slug = "missing-token"


class ServerError(FencegateError):
    """5xx."""


class InternalError(ServerError):
    slug = "internal"


class UnsupportedTransferCoding(ServerError):
    slug = "unsupported-transfer-coding"


class Unavailable(ServerError):
    """503 ``unavailable``: the database is unreachable, read-only or overloaded, a timeout, or
    load shed. ``retry_after`` is the server's ``Retry-After`` in seconds (or ``None``). The
    outcome of a write is unknown: retry it with the same token."""
    slug = "unavailable"

    @property
    def retry_after(self) -> Optional[float]:
        v = self.headers.get("retry-after")
        if v is None:
            return None
        try:
            return float(v)
        except ValueError:
            return None


# ---- 400 -----------------------------------------------------------------------------------

class MalformedToken(BadRequest):
    slug = "malformed-token"


class InvalidKey(BadRequest):
    slug = "invalid-key"

    @property
    def column(self) -> Optional[str]:
        return self.body.get("column")


class InvalidScope(BadRequest):
    slug = "invalid-scope"


class InvalidJson(BadRequest):
    slug = "invalid-json"


class InvalidBatch(BadRequest):
    slug = "invalid-batch"


class InvalidRow(BadRequest):
    slug = "invalid-row"

    @property
    def column(self) -> Optional[str]:
        return self.body.get("column")


class InvalidRequest(BadRequest):
    slug = "invalid-request"


# ---- 409 -----------------------------------------------------------------------------------

class ScopeMismatch(_Named, Conflict, FencingError):
    """409 ``scope-mismatch``: the key (or row) is bound to ``scope`` (``None``: unscoped) and
    the write came under ``presented_scope``."""
    slug = "scope-mismatch"

    @property
    def presented_scope(self) -> Optional[str]:
        return self.body.get("presented_scope")


class LockHeld(_Holder, Conflict):
    """409 ``lock-held``: ``holder`` holds the lock for ``remaining_ms`` more."""
    slug = "lock-held"


class LockLost(_Holder, Conflict, FencingError):
    """409 ``lock-lost``: a renew or release by someone who no longer holds the lease
    (``holder``/``remaining_ms`` name the current holder, if any)."""
    slug = "lock-lost"


class LockExhausted(Conflict):
    slug = "lock-exhausted"


class ScopeHasIssuer(_Named, Conflict):
    slug = "scope-has-issuer"

    @property
    def issuer(self) -> Optional[str]:
        return self.body.get("issuer")


class ResetNotBelow(Conflict):
    slug = "reset-not-below"


class BindingConflict(Conflict):
    slug = "binding-conflict"


# ---- 412 -----------------------------------------------------------------------------------

class StaleToken(_Named, _Tokens, PreconditionFailed):
    """412 ``stale-token``: ``presented`` is below the fence ``current`` of ``key`` (or
    ``scope``; ``resource`` for a table row). A newer holder exists: stop working. For a batch,
    ``stale_keys`` lists every stale key."""
    slug = "stale-token"

    @property
    def stale_keys(self) -> List[Dict[str, Any]]:
        out = []
        for e in self.body.get("stale_keys") or []:
            e = dict(e)
            if "current_token" in e:
                e["current_token"] = _int(e["current_token"])
            out.append(e)
        return out


# ---- 422 -----------------------------------------------------------------------------------

class TokenNotIssued(_Named, _Tokens, Unprocessable, FencingError):
    """422 ``token-not-issued``: under a built-in lock's scope, a token above ``latest_issued``."""
    slug = "token-not-issued"

    @property
    def latest_issued(self) -> Optional[int]:
        return _int(self.body.get("latest_issued"))


class TokenJump(_Named, _Tokens, Unprocessable, FencingError):
    """422 ``token-jump``: ``presented`` raises the fence ``current`` by more than ``max_jump``."""
    slug = "token-jump"

    @property
    def max_jump(self) -> Optional[int]:
        return _int(self.body.get("max_jump"))


class MissingTokenProof(Unprocessable, FencingError):
    """422 ``missing-token-proof``: the scope belongs to an issuer; send its ``X-Fencing-Proof``."""
    slug = "missing-token-proof"


class InvalidTokenProof(Unprocessable, FencingError):
    """422 ``invalid-token-proof``: the proof does not verify for this scope and token."""
    slug = "invalid-token-proof"


class IdempotencyKeyReused(Unprocessable):
    """422 ``idempotency-key-reused``: this ``Idempotency-Key`` was already used for another
    request; nothing was done. Send a new key for a new write."""
    slug = "idempotency-key-reused"


class InvalidValue(Unprocessable):
    """422 ``invalid-value`` (tables): PostgreSQL refused a value."""
    slug = "invalid-value"

    @property
    def column(self) -> Optional[str]:
        return self.body.get("column")

    @property
    def constraint(self) -> Optional[str]:
        return self.body.get("constraint")


def _all_subclasses(cls: Type[FencegateError]) -> List[Type[FencegateError]]:
    out: List[Type[FencegateError]] = []
    for c in cls.__subclasses__():
        out.append(c)
        out.extend(_all_subclasses(c))
    return out


BY_SLUG: Dict[str, Type[FencegateError]] = {
    c.__dict__["slug"]: c for c in _all_subclasses(FencegateError) if c.__dict__.get("slug")
}

BY_STATUS: Dict[int, Type[FencegateError]] = {
    400: BadRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    405: MethodNotAllowed,
    408: BodyTimeout,
    409: Conflict,
    412: PreconditionFailed,
    413: PayloadTooLarge,
    415: UnsupportedMediaType,
    421: MisdirectedRequest,
    422: Unprocessable,
    428: MissingToken,
    500: InternalError,
    501: UnsupportedTransferCoding,
    503: Unavailable,
}


def error_class(status: int, slug: Optional[str]) -> Type[FencegateError]:
    """The class for a problem: by its type slug, else by status, else the base class."""
    if slug is not None and slug in BY_SLUG:
        return BY_SLUG[slug]
    if status in BY_STATUS:
        return BY_STATUS[status]
    if status >= 500:
        return ServerError
    return FencegateError
