"""A throw-away PostgreSQL server for tests: initdb in a temp dir, start on a free loopback port, stop and delete afterwards.

Tests that need PostgreSQL must fail, not skip, when it cannot start: a skipped backend is an untested backend.
Set STATOR_TEST_PG_URL to use an existing server instead (CI service containers); the tests then create and drop
their own databases on it.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from ops import devcluster

PG_USER = "stator"             # the superuser role initdb creates; trust auth, loopback only
RUN_AS = "postgres"            # OS user that owns the cluster when the tests run as root (initdb refuses root)
command_timeout_s = 60         # initdb
start_timeout_s = 30           # until the server accepts connections
stop_timeout_s = 30            # fast shutdown, then SIGKILL
start_attempts_max = 3         # a free port can be taken between choosing it and binding it


class PostgresUnavailable(RuntimeError):
    pass


def _bin_dir() -> Path:
    """The directory holding initdb and postgres: PATH first, else the newest /usr/lib/postgresql/<major>/bin."""
    found = shutil.which("initdb")
    if found and shutil.which("postgres"):
        return Path(os.path.realpath(found)).parent
    dirs = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda d: int(Path(d).parent.name), reverse=True)
    for d in dirs:
        if (Path(d) / "initdb").exists() and (Path(d) / "postgres").exists():
            return Path(d)
    raise PostgresUnavailable("no initdb/postgres on PATH or in /usr/lib/postgresql/*/bin")


def _unprivileged_user() -> pwd.struct_passwd | None:
    """The user to run PostgreSQL as when we are root (it refuses to run as root), created if missing."""
    if os.geteuid() != 0:
        return None
    try:
        return pwd.getpwnam(RUN_AS)
    except KeyError:
        _run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", RUN_AS], None)
        return pwd.getpwnam(RUN_AS)


def _as_user(user: pwd.struct_passwd | None) -> dict:
    # Popen switches user itself, so the server stays our direct child: we can wait for it and it never lingers
    # as an orphan (pg_ctl's daemonised postmaster ends as a zombie where pid 1 does not reap).
    return {} if user is None else {"user": user.pw_uid, "group": user.pw_gid, "extra_groups": []}


def _run(cmd: list[str], user: pwd.struct_passwd | None) -> str:
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=command_timeout_s, **_as_user(user))
    except subprocess.TimeoutExpired as e:
        raise PostgresUnavailable(f"timed out after {command_timeout_s}s: {' '.join(cmd)}") from e
    except OSError as e:
        raise PostgresUnavailable(f"cannot run {cmd[0]}: {e}") from e
    if done.returncode != 0:
        raise PostgresUnavailable(f"{' '.join(cmd)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}")
    return done.stdout


def _free_port() -> int:
    # Below the ephemeral range, like every port a test binds: one the kernel handed out for an outgoing connection
    # could be taken again by the next outgoing connection while the server starts.
    return devcluster.free_base_port()


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no server log)"


def _accepts_connections(url: str) -> bool:
    engine = sa.create_engine(url, poolclass=sa.NullPool, connect_args={"connect_timeout": 2})
    try:
        with engine.connect() as conn:
            conn.exec_driver_sql("SELECT 1")
        return True
    except sa.exc.OperationalError:
        return False
    finally:
        engine.dispose()


def _start(bin_dir: Path, user: pwd.struct_passwd | None, root: Path, port: int) -> subprocess.Popen:
    """Start the server on port and wait until it answers; raise with its log if it exits or stays silent."""
    data, log = root / "data", root / f"server-{port}.log"
    with open(log, "wb") as out:
        # fsync off: the cluster lives for one test session and its speed matters more than its durability.
        proc = subprocess.Popen(
            [str(bin_dir / "postgres"), "-D", str(data), "-p", str(port), "-c", "listen_addresses=127.0.0.1",
             "-c", f"unix_socket_directories={root}", "-c", "fsync=off", "-c", "synchronous_commit=off",
             "-c", "full_page_writes=off"],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, **_as_user(user))
    url = f"postgresql+psycopg://{PG_USER}@127.0.0.1:{port}/postgres"
    deadline = time.monotonic() + start_timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise PostgresUnavailable(f"postgres exited {proc.returncode} on port {port}:\n{_tail(log)}")
        if _accepts_connections(url):
            return proc
        time.sleep(0.1)
    _stop(proc)
    raise PostgresUnavailable(f"postgres not accepting connections after {start_timeout_s}s:\n{_tail(log)}")


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGINT)  # "fast" shutdown: disconnect clients, no waiting for them
    try:
        proc.wait(timeout=stop_timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=stop_timeout_s)


@contextlib.contextmanager
def running_postgres() -> Iterator[str]:
    """Start a private PostgreSQL cluster and yield its SQLAlchemy URL (database ``postgres``); always clean up."""
    bin_dir = _bin_dir()
    user = _unprivileged_user()
    root = Path(tempfile.mkdtemp(prefix="stator-pg-"))
    if user is not None:
        os.chown(root, user.pw_uid, user.pw_gid)
    proc = None
    try:
        _run([str(bin_dir / "initdb"), "-D", str(root / "data"), "-U", PG_USER, "--auth=trust",
              "-E", "UTF8", "--no-locale", "--no-sync"], user)
        errors = []
        for _ in range(start_attempts_max):
            port = _free_port()
            try:
                proc = _start(bin_dir, user, root, port)
                break
            except PostgresUnavailable as e:
                errors.append(str(e))
        else:
            raise PostgresUnavailable("\n\n".join(errors))
        yield f"postgresql+psycopg://{PG_USER}@127.0.0.1:{port}/postgres"
    finally:
        if proc is not None:
            _stop(proc)
        shutil.rmtree(root, ignore_errors=True)


def create_database(server_url: str, prefix: str = "t") -> str:
    """A new empty database on the server; returns its URL. One per test keeps tests independent of each other."""
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    engine = sa.create_engine(server_url, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as conn:
            conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
    finally:
        engine.dispose()
    return sa.make_url(server_url).set(database=name).render_as_string(hide_password=False)


def drop_database(server_url: str, url: str) -> None:
    name = sa.make_url(url).database
    engine = sa.create_engine(server_url, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as conn:
            # FORCE: a test that failed half-way may have left a connection open; the database must go anyway.
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        engine.dispose()


@pytest.fixture(scope="session")
def pg_url() -> Iterator[str]:
    """URL of a PostgreSQL server for this test session (database ``postgres``); fails the test if none can start."""
    external = os.environ.get("STATOR_TEST_PG_URL")
    if external:
        yield external
        return
    started_at = time.monotonic()
    failure = None
    try:
        with running_postgres() as url:
            yield url
    except PostgresUnavailable as e:
        failure = str(e)
    if failure is not None:  # outside the except block, so the report is the message, not a chain of tracebacks
        pytest.fail(f"PostgreSQL could not start after {time.monotonic() - started_at:.1f}s: {failure}", pytrace=False)
