"""Issuer proofs: the ``X-Fencing-Proof`` an ``[[issuers]]`` entry checks."""

from __future__ import annotations

import base64
import hashlib
import hmac
from typing import Any, Union

from ._tokens import Token, token_str

DOMAIN = b"fencegate-token-v1\n"


def proof_message(scope: str, token: Token) -> bytes:
    """The bytes an issuer signs: ``fencegate-token-v1\\n{scope}\\n{token}`` (the scope as the
    lock's name, not percent-encoded; the token in canonical decimal)."""
    return DOMAIN + scope.encode("utf-8") + b"\n" + token_str(token).encode("ascii")


def _b64url(sig: bytes) -> str:
    return base64.urlsafe_b64encode(sig).rstrip(b"=").decode("ascii")


def sign_hmac(secret: Union[bytes, str], scope: str, token: Token) -> str:
    """HMAC-SHA256 proof for an issuer configured with ``hmac_sha256_secret_env`` (the secret
    is at least 32 bytes; a ``str`` is taken as its UTF-8 bytes)."""
    key = secret.encode("utf-8") if isinstance(secret, str) else bytes(secret)
    return _b64url(hmac.new(key, proof_message(scope, token), hashlib.sha256).digest())


def sign_ed25519(private_key: Union[bytes, Any], scope: str, token: Token) -> str:
    """Ed25519 proof for an issuer configured with ``ed25519_public_key``.

    ``private_key`` is the 32-byte seed (raw bytes), or a
    ``cryptography`` ``Ed25519PrivateKey``. Needs the ``cryptography`` package:
    ``pip install 'fencegate[ed25519]'``.
    """
    try:
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError(
            "fencegate.sign_ed25519 needs the 'cryptography' package: pip install 'fencegate[ed25519]'"
        ) from e
    if isinstance(private_key, (bytes, bytearray, memoryview)):
        raw = bytes(private_key)
        if len(raw) != 32:
            raise ValueError(f"an Ed25519 private key is 32 raw bytes (its seed), got {len(raw)}")
        key = Ed25519PrivateKey.from_private_bytes(raw)
    else:
        key = private_key
    return _b64url(key.sign(proof_message(scope, token)))
