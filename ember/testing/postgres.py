"""A private PostgreSQL server for the SQL source tests: Debian's ``postgresql`` binaries,
``initdb`` into a temporary directory, ``pg_ctl`` serving on a Unix socket in it (no TCP
port: ``listen_addresses=''``), stopped and removed at the end. As root the server runs as
the ``postgres`` user (PostgreSQL refuses to run as root).

Example (needs the ``postgresql`` package and ``adbc-driver-postgresql``)::

    with PostgresServer() as pg:
        uri = pg.uri                    # data.sql.uri for ember
        pg.execute("CREATE TABLE t (k int8)")
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any, Iterator

from ember.testing.distributed import free_port

__all__ = ["PostgresServer", "missing", "server_or_skip"]


def _bin_dir() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


def missing() -> str | None:
    """What the server needs that is not here (a message for a skip), or None."""
    try:
        import adbc_driver_postgresql.dbapi  # noqa: F401
    except ImportError as e:
        return f"the PostgreSQL tests need adbc-driver-postgresql ({e}); pip install adbc-driver-postgresql"
    if _bin_dir() is None:
        return "the PostgreSQL tests need the server binaries (initdb, pg_ctl): apt-get install postgresql"
    if os.geteuid() == 0 and shutil.which("runuser") is None:
        return "the PostgreSQL tests run as root and need runuser to start the server as the postgres user"
    return None


def server_or_skip() -> Iterator["PostgresServer"]:
    """A pytest fixture's body: a started server for the fixture's scope, stopped after it; the
    test skips, saying what is missing or why the server did not start, when it cannot start.

    Use as ``postgres = pytest.fixture(scope="module")(server_or_skip)``.
    """
    import pytest

    why = missing()
    if why:
        pytest.skip(why)
    try:
        server = PostgresServer().__enter__()
    except Exception as e:  # noqa: BLE001  # any failure to start is a skip that says why
        pytest.skip(f"the PostgreSQL test server did not start: {e}")
    try:
        yield server
    finally:
        server.__exit__(None, None, None)



class PostgresServer:
    """A fresh PostgreSQL cluster for the with-block, reachable at ``uri`` (a Unix socket in a
    temporary directory; database ``ember``, user ``postgres``, trust authentication)."""

    driver = "postgresql"  # data.sql.driver for it

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="ember-pg-"))
        self.data = self.root / "data"
        self.port = free_port()  # names the socket file (.s.PGSQL.<port>); no TCP listener
        self.uri = f"postgresql://postgres@/ember?host={self.root}&port={self.port}"
        self._bin = _bin_dir()

    def _run(self, *args: str) -> subprocess.CompletedProcess:
        cmd = [str(self._bin / args[0]), *args[1:]] if self._bin else list(args)
        if os.geteuid() == 0:
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=60)

    def __enter__(self) -> "PostgresServer":
        if os.geteuid() == 0:
            shutil.chown(self.root, "postgres", "postgres")
        self.root.chmod(0o755)
        steps = [("initdb", "-D", str(self.data), "-U", "postgres", "-A", "trust", "--no-sync", "-E", "UTF8",
                  "--locale=C"),
                 ("pg_ctl", "-D", str(self.data), "-l", str(self.root / "log"), "-w", "-t", "30", "-o",
                  f"-k {self.root} -p {self.port} -c listen_addresses='' -c fsync=off", "start"),
                 ("createdb", "-h", str(self.root), "-p", str(self.port), "-U", "postgres", "ember")]
        for step in steps:
            done = self._run(*step)
            if done.returncode:
                log = (self.root / "log").read_text() if (self.root / "log").exists() else ""
                self.__exit__(None, None, None)
                raise RuntimeError(f"{step[0]} failed ({done.returncode}): {done.stderr.strip()} {log[-2000:]}")
        return self

    def execute(self, *statements: str, parameters: Any = None) -> None:
        """Run ``statements`` and commit (the tests' way to create and fill tables)."""
        import adbc_driver_postgresql.dbapi as pg

        with pg.connect(self.uri) as conn, conn.cursor() as cur:
            for s in statements:
                cur.execute(s, parameters)
            conn.commit()

    def load(self, table: str, data: Any, mode: str = "create") -> None:
        """Write the arrow table ``data`` to ``table`` (``mode``: create, or append)."""
        import adbc_driver_postgresql.dbapi as pg

        with pg.connect(self.uri) as conn, conn.cursor() as cur:
            cur.adbc_ingest(table, data, mode=mode)
            conn.commit()

    def __exit__(self, *exc: object) -> None:
        if (self.data / "postmaster.pid").exists():
            self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
        shutil.rmtree(self.root, ignore_errors=True)
