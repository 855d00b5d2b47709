from __future__ import annotations

from typing import Union

MAX_TOKEN = 9223372036854775807
"""The largest fencing token (PostgreSQL ``bigint``)."""

Token = Union[int, str]


def token_str(token: Token) -> str:
    """The canonical decimal of a fencing token (``int`` or a ``str`` of decimal digits).

    Raises ``TypeError`` for anything else (``bool`` and ``float`` included: a float has
    already lost precision above 2**53) and ``ValueError`` outside ``0..=9223372036854775807``
    or for a string that is not plain decimal digits.
    """
    if isinstance(token, bool) or not isinstance(token, (int, str)):
        raise TypeError(f"a fencing token is an int or a decimal str, not {type(token).__name__}")
    if isinstance(token, str):
        if not (token.isascii() and token.isdigit()):
            raise ValueError(f"a fencing token is a decimal integer, got {token!r}")
        n = int(token)
    else:
        n = int(token)
    if n < 0 or n > MAX_TOKEN:
        raise ValueError(f"a fencing token is in 0..={MAX_TOKEN}, got {n}")
    return str(n)


def token_int(v: object) -> int:
    """A token from a response body (a JSON string of decimals) as an ``int``."""
    if isinstance(v, bool):
        raise ValueError(f"not a fencing token: {v!r}")
    if isinstance(v, int):
        return v
    if isinstance(v, str) and v.isascii() and v.isdigit():
        return int(v)
    raise ValueError(f"not a fencing token: {v!r}")
