"""PostgreSQL URLs: every spelling a user may write, read once into one form.

`postgresql://`, `postgres://` (Heroku and many hosts), and SQLAlchemy's driver spellings
(`postgresql+asyncpg://`, `postgresql+psycopg://`, `postgresql+psycopg2://`) all name the same
server. `normalize_database_url` turns any of them into the plain libpq form; the engine's and
asyncpg's forms are derived from that one result, so no caller parses a URL itself.
"""

from __future__ import annotations

from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError

from bot.errors import ConfigError

_POSTGRES_BACKENDS = frozenset({"postgresql", "postgres"})


def _parse(url: str) -> URL:
    """Parse and check a PostgreSQL URL into the plain `postgresql` form; raises ConfigError."""
    try:
        parsed = make_url(url.strip())
    except (ArgumentError, ValueError) as exc:
        raise ConfigError(f"DATABASE_URL is not a database URL: {exc}") from exc
    if parsed.get_backend_name() not in _POSTGRES_BACKENDS:
        raise ConfigError(
            f"DATABASE_URL must be a PostgreSQL URL (postgresql://user@host:5432/name), "
            f"got the scheme {parsed.drivername!r}"
        )
    return parsed.set(drivername="postgresql")


def normalize_database_url(url: str) -> str:
    """Any PostgreSQL spelling as libpq and asyncpg read it (`postgresql://…`); raises
    ConfigError for anything that is not a PostgreSQL URL."""
    return _parse(url).render_as_string(hide_password=False)


def plain_url(url: str) -> str:
    """The URL for asyncpg.connect and libpq tools (LISTEN connections, CREATE DATABASE)."""
    return normalize_database_url(url)


def async_url(url: str) -> str:
    """The URL for SQLAlchemy's asyncpg dialect; raises ConfigError for non-PostgreSQL."""
    parsed = _parse(url)
    query = dict(parsed.query)
    # libpq's `sslmode` reaches asyncpg.connect as a keyword it does not take; asyncpg's own
    # `ssl` accepts the same values (disable, prefer, require, verify-ca, verify-full).
    if "sslmode" in query:
        sslmode = query.pop("sslmode")
        query.setdefault("ssl", sslmode)
        parsed = parsed.set(query=query)
    return parsed.set(drivername="postgresql+asyncpg").render_as_string(hide_password=False)


def masked_url(url: str) -> str:
    """The URL to show in messages: its password as `***`."""
    try:
        return _parse(url).render_as_string(hide_password=True)
    except ConfigError:
        return "(not a PostgreSQL URL)"


def database_url_with_name(url: str, name: str) -> str:
    """The plain URL of database `name` on the server of `url`."""
    return _parse(url).set(database=name).render_as_string(hide_password=False)


__all__ = [
    "async_url",
    "database_url_with_name",
    "masked_url",
    "normalize_database_url",
    "plain_url",
]
