"""Find or make a PostgreSQL server for tests and the demo, and scratch databases on it.

Order: DATABASE_URL if set; else the server on 127.0.0.1:5432 if one answers; else a
throwaway cluster made with the machine's initdb/pg_ctl; else the `pgserver` wheel.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import glob
import logging
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import asyncpg
from sqlalchemy.engine import make_url

from bot.database_url import database_url_with_name, masked_url, plain_url
from bot.db import connect_problem
from bot.errors import ConfigError

log = logging.getLogger(__name__)


def _local_server_answers(host: str = "127.0.0.1", port: int = 5432) -> str | None:
    """Return an admin URL for the local server if it accepts us, else None."""
    try:
        with socket.create_connection((host, port), timeout=1.0):
            pass
    except OSError:
        return None
    for user in dict.fromkeys(
        [os.environ.get("PGUSER", ""), "postgres", os.environ.get("USER", "")]
    ):
        if not user:
            continue
        url = f"postgresql://{user}@{host}:{port}/postgres"
        try:
            # Callers may be inside an event loop already (benchmarks): check from a thread.
            with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
                pool.submit(asyncio.run, _check(url)).result()
        except (OSError, asyncpg.PostgresError):
            continue
        return url
    return None


async def _check(url: str) -> None:
    conn = await asyncpg.connect(url, timeout=3)
    try:
        await conn.execute("SELECT 1")
    finally:
        await conn.close()


def _find_binary(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    candidates = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), reverse=True)
    return candidates[0] if candidates else None


def _unprivileged_user() -> str | None:
    import pwd

    for name in ("postgres", "nobody"):
        try:
            pwd.getpwnam(name)
        except KeyError:
            continue
        if shutil.which("runuser"):
            return name
    return None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


INITDB_OPTIONS = ("-A", "trust", "--no-sync", "-E", "UTF8")


@dataclass
class Cluster:
    """A PostgreSQL cluster in a directory of its own, run by this process with pg_ctl: the
    fallback server, and the server fault drills stop and restart under a running bot."""

    root: Path
    port: int
    pg_ctl: str
    run_as: list[str]
    user: str = "postgres"

    @property
    def url(self) -> str:
        return f"postgresql://{self.user}@127.0.0.1:{self.port}/postgres"

    def _ctl(self, *args: str) -> None:
        subprocess.run(
            [*self.run_as, self.pg_ctl, "-D", str(self.root / "data"), *args],
            check=True,
            capture_output=True,
        )

    def _options(self) -> list[str]:
        options = f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off"
        return ["-l", str(self.root / "log"), "-o", options]

    def start(self) -> None:
        self._ctl(*self._options(), "-w", "start")

    def stop(self, mode: str = "fast") -> None:
        """Stop the server: `fast` ends sessions cleanly, `immediate` is a crash."""
        self._ctl("-m", mode, "-w", "stop")

    def restart(self, mode: str = "fast") -> None:
        self._ctl(*self._options(), "-m", mode, "-w", "restart")


@contextlib.contextmanager
def throwaway_cluster(initdb: str | None = None, pg_ctl: str | None = None) -> Iterator[Cluster]:
    """A new cluster in a temp directory (the machine's initdb/pg_ctl), started, and stopped
    and removed afterwards."""
    initdb = initdb or _find_binary("initdb")
    pg_ctl = pg_ctl or _find_binary("pg_ctl")
    if not initdb or not pg_ctl:
        raise ConfigError("initdb and pg_ctl are not installed")
    root = Path(tempfile.mkdtemp(prefix="review-bot-pg-"))
    run_as: list[str] = []
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        # initdb refuses to run as root: run the cluster as an unprivileged system user.
        owner = _unprivileged_user()
        if owner is None:
            raise ConfigError("initdb cannot run as root and no unprivileged user was found")
        run_as = ["runuser", "-u", owner, "--"]
        shutil.chown(root, owner)
    cluster = Cluster(root, _free_port(), pg_ctl, run_as)
    subprocess.run(
        [*run_as, initdb, "-D", str(root / "data"), "-U", cluster.user, *INITDB_OPTIONS],
        check=True,
        capture_output=True,
    )
    cluster.start()
    try:
        yield cluster
    finally:
        with contextlib.suppress(subprocess.CalledProcessError):
            cluster.stop("immediate")
        shutil.rmtree(root, ignore_errors=True)


@contextlib.contextmanager
def _throwaway_cluster(initdb: str, pg_ctl: str) -> Iterator[str]:
    """A PostgreSQL cluster in a temp directory, stopped and removed afterwards."""
    with throwaway_cluster(initdb, pg_ctl) as cluster:
        yield cluster.url


@contextlib.contextmanager
def _pgserver_cluster() -> Iterator[str]:
    """PostgreSQL from the `pgserver` wheel, installed on demand."""
    try:
        import pgserver
    except ImportError:
        log.warning("no PostgreSQL found; installing pgserver from PyPI")
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "--quiet", "pgserver>=0.1.4"], check=True
        )
        import pgserver

    root = Path(tempfile.mkdtemp(prefix="review-bot-pgserver-"))
    server = pgserver.get_server(str(root), cleanup_mode="stop")
    try:
        yield server.get_uri()
    finally:
        server.cleanup()
        shutil.rmtree(root, ignore_errors=True)


@dataclass(frozen=True, slots=True)
class ProvisionedServer:
    """A PostgreSQL server to make databases on, and words that say which one it is."""

    url: str
    description: str


@contextlib.contextmanager
def provision(*, local_port: int = 5432) -> Iterator[ProvisionedServer]:
    """Find or start a PostgreSQL server that may create databases (order: module docstring)."""
    configured = os.environ.get("DATABASE_URL")
    if configured:
        url = plain_url(configured)
        log.info("using DATABASE_URL", extra={"action": "db_provision", "source": "env"})
        yield ProvisionedServer(url, f"the server of DATABASE_URL ({_where(url)})")
        return
    local = _local_server_answers(port=local_port)
    if local:
        log.info("using the local server", extra={"action": "db_provision", "source": "local"})
        yield ProvisionedServer(local, f"the local PostgreSQL server at {_where(local)}")
        return
    initdb, pg_ctl = _find_binary("initdb"), _find_binary("pg_ctl")
    if initdb and pg_ctl:
        log.info("starting a throwaway cluster", extra={"action": "db_provision"})
        with _throwaway_cluster(initdb, pg_ctl) as url:
            yield ProvisionedServer(
                url, f"a throwaway cluster made with {initdb} at {_where(url)}, removed after"
            )
        return
    with _pgserver_cluster() as url:
        yield ProvisionedServer(url, "an embedded PostgreSQL (the pgserver wheel), removed after")


@contextlib.contextmanager
def provision_server() -> Iterator[str]:
    """Yield an admin URL of a PostgreSQL server that may create databases."""
    with provision() as server:
        yield server.url


def _where(url: str) -> str:
    """host:port of a URL, without its credentials."""
    parsed = make_url(url)
    return f"{parsed.host or 'localhost'}:{parsed.port or 5432}"


def database_url(server_url: str, name: str) -> str:
    """The URL of database `name` on the server of `server_url`."""
    return database_url_with_name(server_url, name)


def unique_database_name(prefix: str = "review_bot") -> str:
    return f"{prefix}_{os.getpid()}_{secrets.token_hex(4)}"


async def create_database(server_url: str, name: str, *, template: str | None = None) -> str:
    """Create database `name` (optionally from a template); returns its URL. Raises
    ConfigError, naming the server's URL, when it refuses the connection or is not there."""
    try:
        conn = await asyncpg.connect(plain_url(server_url), timeout=10)
    except Exception as exc:
        problem = connect_problem(exc)
        if problem is None:
            raise
        raise ConfigError(f"database {masked_url(server_url)}: {problem.reason}") from None
    try:
        clause = f' TEMPLATE "{template}"' if template else ""
        await conn.execute(f'CREATE DATABASE "{name}"{clause}')
    finally:
        await conn.close()
    return database_url(server_url, name)


async def drop_database(server_url: str, name: str) -> None:
    """Drop database `name`, disconnecting whoever is still in it."""
    conn = await asyncpg.connect(plain_url(server_url), timeout=10)
    try:
        await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await conn.close()


@contextlib.asynccontextmanager
async def scratch_database(server_url: str, prefix: str = "review_bot") -> AsyncIterator[str]:
    """A fresh, uniquely named database, dropped afterwards."""
    name = unique_database_name(prefix)
    url = await create_database(server_url, name)
    try:
        yield url
    finally:
        await drop_database(server_url, name)
