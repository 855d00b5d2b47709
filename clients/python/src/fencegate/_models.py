"""What the server answers, as small typed records. Tokens are ``int``; ``raw`` keeps the
whole decoded body for fields added later. A write's ``replayed`` is true when the server
answered a retry with the write's first outcome (``Idempotent-Replayed: true``): the write landed
once, earlier; it compares equal to the first answer."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from ._tokens import token_int


def _opt_token(v: Any) -> Optional[int]:
    return None if v is None else token_int(v)


@dataclass(frozen=True)
class Entry:
    """``GET /v1/kv/{key}``."""
    key: str
    value: Any
    fence_token: int
    scope: Optional[str]
    version: Optional[int]
    updated_at: Optional[str]
    raw: Dict[str, Any] = field(repr=False, compare=False, default_factory=dict)

    @classmethod
    def parse(cls, b: Dict[str, Any]) -> "Entry":
        return cls(b["key"], b.get("value"), token_int(b["fence_token"]), b.get("scope"),
                   b.get("version"), b.get("updated_at"), b)


@dataclass(frozen=True)
class WriteResult:
    """A fenced write (kv or table PUT/PATCH): ``created`` is true for a 201."""
    key: str
    fence_token: int
    scope: Optional[str]
    created: bool
    version: Optional[int] = None
    resource: Optional[str] = None
    raw: Dict[str, Any] = field(repr=False, compare=False, default_factory=dict)
    replayed: bool = field(default=False, compare=False)

    @classmethod
    def parse(cls, b: Dict[str, Any], status: int) -> "WriteResult":
        return cls(b["key"], token_int(b["fence_token"]), b.get("scope"), status == 201,
                   b.get("version"), b.get("resource"), b)


@dataclass(frozen=True)
class DeleteResult:
    key: str
    fence_token: int
    scope: Optional[str]
    deleted: bool
    resource: Optional[str] = None
    raw: Dict[str, Any] = field(repr=False, compare=False, default_factory=dict)
    replayed: bool = field(default=False, compare=False)

    @classmethod
    def parse(cls, b: Dict[str, Any]) -> "DeleteResult":
        return cls(b["key"], token_int(b["fence_token"]), b.get("scope"),
                   bool(b.get("deleted", True)), b.get("resource"), b)


@dataclass(frozen=True)
class OpResult:
    op: str
    key: str
    status: int
    resource: Optional[str] = None


@dataclass(frozen=True)
class BatchResult:
    fence_token: int
    scope: Optional[str]
    results: List[OpResult]
    raw: Dict[str, Any] = field(repr=False, compare=False, default_factory=dict)
    replayed: bool = field(default=False, compare=False)

    @classmethod
    def parse(cls, b: Dict[str, Any]) -> "BatchResult":
        return cls(token_int(b["fence_token"]), b.get("scope"),
                   [OpResult(r["op"], r["key"], r["status"], r.get("resource"))
                    for r in b.get("results", [])], b)


@dataclass(frozen=True)
class Fence:
    """A scope's fence (``GET``/``POST /v1/fences/{scope}``); ``created`` for a 201 claim."""
    scope: str
    fence_token: int
    created: bool = False
    raw: Dict[str, Any] = field(repr=False, compare=False, default_factory=dict)
    replayed: bool = field(default=False, compare=False)

    @classmethod
    def parse(cls, b: Dict[str, Any], status: int = 200) -> "Fence":
        return cls(b["scope"], token_int(b["fence_token"]), status == 201, b)


@dataclass(frozen=True)
class Grant:
    """A lease of the built-in lock service (grant or renew)."""
    name: str
    token: int
    owner: str
    expires_at: str
    ttl_ms: int
    scope: str
    raw: Dict[str, Any] = field(repr=False, compare=False, default_factory=dict)

    @classmethod
    def parse(cls, b: Dict[str, Any]) -> "Grant":
        return cls(b["name"], token_int(b["token"]), b.get("owner", ""), b.get("expires_at", ""),
                   int(b.get("ttl_ms", 0)), b.get("scope", b["name"]), b)


@dataclass(frozen=True)
class Released:
    name: str
    token: int
    released: bool
    raw: Dict[str, Any] = field(repr=False, compare=False, default_factory=dict)

    @classmethod
    def parse(cls, b: Dict[str, Any]) -> "Released":
        return cls(b["name"], token_int(b["token"]), bool(b.get("released", True)), b)


@dataclass(frozen=True)
class Holder:
    """``GET /v1/locks/{name}`` while held (the token is never shown)."""
    name: str
    owner: str
    remaining_ms: int
    raw: Dict[str, Any] = field(repr=False, compare=False, default_factory=dict)

    @classmethod
    def parse(cls, b: Dict[str, Any]) -> "Holder":
        return cls(b["name"], b["owner"], int(b["remaining_ms"]), b)


@dataclass(frozen=True)
class Row:
    """``GET /v1/tables/{resource}/{key}``."""
    resource: str
    key: str
    row: Dict[str, Any]
    fence_token: Optional[int]
    scope: Optional[str]
    raw: Dict[str, Any] = field(repr=False, compare=False, default_factory=dict)

    @classmethod
    def parse(cls, b: Dict[str, Any]) -> "Row":
        return cls(b["resource"], b["key"], b.get("row") or {}, _opt_token(b.get("fence_token")),
                   b.get("scope"), b)


@dataclass(frozen=True)
class AdminResult:
    """A reset, retire or rebind: ``from_``/``to`` are the fence before and after (resets,
    retires); ``rebound`` counts keys or rows a rebind moved."""
    target: str
    name: Optional[str]
    from_: Optional[int]
    to: Optional[int]
    audit_id: int
    resource: Optional[str] = None
    rebound: Optional[int] = None
    raw: Dict[str, Any] = field(repr=False, compare=False, default_factory=dict)

    @classmethod
    def parse(cls, b: Dict[str, Any]) -> "AdminResult":
        return cls(b.get("target", ""), b.get("name", b.get("prefix")), _opt_token(b.get("from")),
                   _opt_token(b.get("to")), token_int(b["audit_id"]), b.get("resource"),
                   b.get("rebound"), b)


@dataclass(frozen=True)
class AuditEntry:
    id: int
    at: str
    actor: str
    action: str
    target: str
    name: Optional[str]
    resource: Optional[str]
    from_: Optional[int]
    to: Optional[int]
    from_scope: Optional[str]
    to_scope: Optional[str]
    reason: str
    raw: Dict[str, Any] = field(repr=False, compare=False, default_factory=dict)

    @classmethod
    def parse(cls, b: Dict[str, Any]) -> "AuditEntry":
        return cls(token_int(b["id"]), b.get("at", ""), b.get("actor", ""), b.get("action", ""),
                   b.get("target", ""), b.get("name"), b.get("resource"),
                   _opt_token(b.get("from")), _opt_token(b.get("to")), b.get("from_scope"),
                   b.get("to_scope"), b.get("reason", ""), b)
