"""fencegate: a client for the fencegate HTTP fencing proxy.

    client = fencegate.Client("http://127.0.0.1:8080")
    with client.lease("nightly", ttl_ms=10_000) as lease:
        lease.put("invoice-7", {"total": 120})
"""

__version__ = "0.1.0"

from ._async import AsyncClient, AsyncLease
from ._core import Op, Signer, TableKey, new_idempotency_key, ops
from ._errors import (BadRequest, BindingConflict, BodyTimeout, Conflict, FencegateError,
                      FencingError, Forbidden, InternalError, InvalidBatch, InvalidJson,
                      InvalidKey, InvalidRequest, InvalidRow, InvalidScope, InvalidTokenProof,
                      InvalidValue, IdempotencyKeyReused, LeaseLost, LockExhausted, LockHeld, LockLost, MalformedToken,
                      MethodNotAllowed, MisdirectedRequest, MissingToken, MissingTokenProof,
                      NotFound, PayloadTooLarge, PreconditionFailed, ResetNotBelow,
                      ScopeHasIssuer, ScopeMismatch, ServerError, StaleToken, TokenJump,
                      TokenNotIssued, TransportError, Unauthenticated, Unauthorized, Unavailable,
                      Unprocessable, UnsupportedMediaType, UnsupportedTransferCoding, error_class)
from ._models import (AdminResult, AuditEntry, BatchResult, DeleteResult, Entry, Fence, Grant,
                      Holder, OpResult, Released, Row, WriteResult)
from ._proof import proof_message, sign_ed25519, sign_hmac
from ._sync import Client, Lease
from ._tokens import MAX_TOKEN, Token, token_str

__all__ = [
    "__version__", "Client", "AsyncClient", "Lease", "AsyncLease", "ops", "Op", "Signer",
    "TableKey", "new_idempotency_key", "Token", "MAX_TOKEN", "token_str", "sign_hmac", "sign_ed25519", "proof_message",
    "Entry", "WriteResult", "DeleteResult", "BatchResult", "OpResult", "Fence", "Grant",
    "Released", "Holder", "Row", "AdminResult", "AuditEntry", "error_class",
    "FencegateError", "TransportError", "FencingError", "LeaseLost", "BadRequest",
    "MalformedToken", "InvalidKey", "InvalidScope", "InvalidJson", "InvalidBatch", "InvalidRow",
    "InvalidRequest", "Unauthorized", "Unauthenticated", "Forbidden", "NotFound",
    "MethodNotAllowed", "BodyTimeout", "Conflict", "ScopeMismatch", "LockHeld", "LockLost",
    "LockExhausted", "ScopeHasIssuer", "ResetNotBelow", "BindingConflict", "PreconditionFailed",
    "StaleToken", "PayloadTooLarge", "UnsupportedMediaType", "MisdirectedRequest",
    "Unprocessable", "TokenNotIssued", "TokenJump", "MissingTokenProof", "InvalidTokenProof",
    "InvalidValue", "IdempotencyKeyReused", "MissingToken", "ServerError", "InternalError", "UnsupportedTransferCoding",
    "Unavailable",
]
