"""Who may read the admin side: bearer tokens, and whether a request came over HTTPS (pure)."""

from __future__ import annotations

import hmac


def bearer_token(authorization: str | None) -> str | None:
    """The token of an `Authorization: Bearer ...` header, if any."""
    if not authorization:
        return None
    scheme, _, value = authorization.partition(" ")
    return value.strip() if scheme.lower() == "bearer" and value.strip() else None


def token_matches(given: str | None, expected: str) -> bool:
    """Constant-time comparison of a presented token with the configured one."""
    return given is not None and hmac.compare_digest(given.encode(), expected.encode())


def came_over_https(
    *, direct_tls: bool, forwarded_proto: str | None, trust_forwarded_proto: bool
) -> bool:
    """Whether the browser's connection was HTTPS: TLS to us, or to a proxy we trust.

    X-Forwarded-Proto is believed only when the operator says a proxy sets it: anyone can send
    the header, and a cookie marked Secure on its word alone would be harmless but a cookie
    left unmarked behind a real TLS proxy is not.
    """
    if direct_tls:
        return True
    if not trust_forwarded_proto or not forwarded_proto:
        return False
    # A chain of proxies appends: the first value is what the client used.
    return forwarded_proto.split(",")[0].strip().lower() == "https"
