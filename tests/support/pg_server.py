"""A throw-away PostgreSQL server for tests and benchmarks: own data directory, a free loopback port, stopped after.

Used by the ``postgres_server`` / ``postgres_url`` fixtures of ``tests/fleet/conftest.py`` (the one place tests start
a server) and by ``benchmarks/fleet_ingest.py`` and ``benchmarks/fleet_status.py``. Raises ``PostgresUnavailable`` (with the reason) when the server
binaries, or a user to run them as, are missing: tests skip on it, the benchmark stops with it.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
from glob import glob
from pathlib import Path

from tests.support.mqtt_broker import free_port


class PostgresUnavailable(RuntimeError):
    """No PostgreSQL server can be started here; the message says why."""


def pg_bin(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    cands = sorted(glob(f"/usr/lib/postgresql/*/bin/{name}"))
    return cands[-1] if cands else None


class PostgresServer:
    """``with PostgresServer() as url:`` -- ``fsync`` off by default (tests); ``durable=True`` keeps the defaults."""

    def __init__(self, *, durable: bool = False) -> None:
        self.durable = durable
        self.initdb, self.pg_ctl = pg_bin("initdb"), pg_bin("pg_ctl")
        if not self.initdb or not self.pg_ctl:
            raise PostgresUnavailable("PostgreSQL server binaries are not installed (apt-get install postgresql)")
        self.as_user: list[str] = []
        self._owner: tuple[int, int] | None = None
        if os.geteuid() == 0:  # PostgreSQL refuses to run as root
            try:
                pw = pwd.getpwnam("postgres")
            except KeyError:
                raise PostgresUnavailable(
                    "running as root and there is no 'postgres' user to run the server as"
                ) from None
            runuser = shutil.which("runuser")
            if runuser is None:
                raise PostgresUnavailable("running as root without runuser to start PostgreSQL as 'postgres'")
            self.as_user = [runuser, "-u", "postgres", "--"]
            self._owner = (pw.pw_uid, pw.pw_gid)
        self.dir: Path | None = None
        self.url = ""

    def _run(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*self.as_user, *args], capture_output=True, text=True, timeout=60)

    def start(self) -> str:
        d = self.dir = Path(tempfile.mkdtemp(prefix="edgekit-pg-"))
        if self._owner:
            os.chown(d, *self._owner)
        port = free_port()
        data, log = d / "data", d / "server.log"
        p = self._run(str(self.initdb), "-D", str(data), "-U", "edgekit", "--auth=trust", "-E", "UTF8", "--no-sync")
        if p.returncode != 0:
            self.stop()
            raise RuntimeError(f"initdb failed here: {p.stderr.strip()[-300:]}")
        opts = f"-c listen_addresses=127.0.0.1 -p {port} -k {d}" + ("" if self.durable else " -c fsync=off")
        p = self._run(str(self.pg_ctl), "-D", str(data), "-l", str(log), "-w", "-t", "30", "-o", opts, "start")
        if p.returncode != 0:
            tail = log.read_text()[-300:] if log.exists() else ""
            self.stop()
            raise RuntimeError(f"PostgreSQL did not start: {p.stderr.strip()[-300:]} {tail}")
        self.url = f"postgresql://edgekit@127.0.0.1:{port}/postgres"
        return self.url

    def stop(self) -> None:
        d, self.dir = self.dir, None
        if d is None:
            return
        if (d / "data" / "postmaster.pid").exists():
            self._run(str(self.pg_ctl), "-D", str(d / "data"), "-m", "fast", "-w", "stop")
        shutil.rmtree(d, ignore_errors=True)

    def pid(self) -> int | None:
        """The postmaster's process id (its backends are its children)."""
        f = self.dir / "data" / "postmaster.pid" if self.dir else None
        return int(f.read_text().split()[0]) if f and f.exists() else None

    def __enter__(self) -> str:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
