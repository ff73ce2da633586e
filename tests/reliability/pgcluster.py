"""A throwaway PostgreSQL cluster for tests that must restart or stop the server.

The suite's shared server (CAIRNQ_TEST_DATABASE=postgres, usually port 5432)
is used by everyone else's tests at the same time, so nothing here ever
touches it: `ThrowawayCluster.create()` runs initdb into a fresh temp
directory and starts a private postmaster on a free port in 55432-55499,
listening on 127.0.0.1 and on a socket in that directory only. `destroy()`
stops it with `pg_ctl stop -m immediate` and deletes the directory.

initdb and postgres refuse to run as root; as root the binaries run as the
`postgres` user through runuser, with the directory chowned to it.
`unavailable()` says why a cluster cannot be made here (for pytest.skip).
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from contextlib import suppress
from pathlib import Path

import psycopg

PORTS = range(55432, 55500)
SUPERUSER = "root"  # the name tests/settings.py connects as (PGUSER defaults to root)
PG_CTL_WAIT_S = 60


def find_bindir() -> Path | None:
    """The newest Debian PostgreSQL bin directory with initdb and pg_ctl, or None."""
    candidates = sorted(
        glob.glob("/usr/lib/postgresql/*/bin"),
        key=lambda path: int(Path(path).parent.name) if Path(path).parent.name.isdigit() else 0,
        reverse=True,
    )
    for path in candidates:
        bindir = Path(path)
        if all(os.access(bindir / tool, os.X_OK) for tool in ("initdb", "pg_ctl", "postgres")):
            return bindir
    return None


def _run_as() -> list[str]:
    """The command prefix that runs a server binary as a user it accepts."""
    if os.geteuid() != 0:
        return []
    return ["runuser", "-u", "postgres", "--"]


def unavailable() -> str | None:
    """Return why no throwaway cluster can be made here, or None when one can."""
    if find_bindir() is None:
        return "pg binaries missing: no initdb/pg_ctl/postgres under /usr/lib/postgresql/*/bin"
    if os.geteuid() == 0:
        if shutil.which("runuser") is None:
            return "running as root and runuser is missing (initdb refuses root)"
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            return "running as root and there is no postgres user to run initdb as"
    return None


def _port_is_free(port: int) -> bool:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


class ThrowawayCluster:
    """One private postmaster in a temp directory; see the module docstring."""

    def __init__(self, bindir: Path, root: Path) -> None:
        self.bindir = bindir
        self.root = root
        self.data = root / "data"
        self.logfile = root / "server.log"
        self.host = "127.0.0.1"
        self.port: int | None = None
        self.user = SUPERUSER

    # ------------------------------------------------------------ lifecycle
    @classmethod
    def create(cls) -> ThrowawayCluster:
        """initdb and start a cluster; on any failure, clean up and raise."""
        bindir = find_bindir()
        if bindir is None:
            raise RuntimeError(unavailable())
        root = Path(tempfile.mkdtemp(prefix="cairnq-pgcluster-"))
        cluster = cls(bindir, root)
        try:
            if os.geteuid() == 0:
                entry = pwd.getpwnam("postgres")
                os.chown(root, entry.pw_uid, entry.pw_gid)
            cluster._initdb()
            cluster._start_on_a_free_port()
        except BaseException:
            cluster.destroy()
            raise
        return cluster

    def _tool(self, name: str, *args: str, timeout: float = PG_CTL_WAIT_S + 30):
        result = subprocess.run(
            [*_run_as(), str(self.bindir / name), *args],
            capture_output=True, text=True, timeout=timeout, cwd=self.root,
        )
        return result

    def _check(self, result, what: str) -> None:
        if result.returncode != 0:
            raise RuntimeError(
                f"{what} failed (exit {result.returncode}):\n{result.stdout}\n{result.stderr}"
                f"\n--- server log ---\n{self.server_log()}"
            )

    def _initdb(self) -> None:
        result = self._tool(
            "initdb", "-D", str(self.data), "-U", self.user, "--auth=trust",
            "-E", "UTF8", "--no-locale", "--no-sync",
        )
        self._check(result, "initdb")

    def _configure(self, port: int) -> None:
        # Appended to postgresql.conf rather than passed with -o, so that a
        # `pg_ctl restart` comes back with exactly the same settings (a later
        # line wins over initdb's defaults).
        settings = {
            "port": str(port),
            "listen_addresses": "'127.0.0.1'",
            "unix_socket_directories": f"'{self.root}'",
            # A test cluster: no crash of the machine is being simulated, and
            # a fast shutdown still writes a checkpoint.
            "fsync": "off",
            "max_connections": "100",
            "shared_buffers": "32MB",
            "logging_collector": "off",
        }
        conf = self.data / "postgresql.conf"
        if not hasattr(self, "_pristine_conf"):
            self._pristine_conf = conf.read_text()
        lines = "".join(f"{name} = {value}\n" for name, value in settings.items())
        # Rewriting the existing file keeps its owner (postgres, when run as root).
        conf.write_text(self._pristine_conf + "\n# cairnq throwaway cluster\n" + lines)

    def _start_on_a_free_port(self) -> None:
        tried = []
        for port in PORTS:
            if not _port_is_free(port):
                continue
            tried.append(port)
            self._configure(port)
            result = self._pg_ctl("start", "-l", str(self.logfile))
            if result.returncode == 0:
                self.port = port
                return
            # Someone took the port between the check and the start: try the next.
            if "could not bind" not in self.server_log() or len(tried) >= 5:
                self._check(result, f"pg_ctl start on port {port}")
        raise RuntimeError(f"No free port for a throwaway cluster in {PORTS} (tried {tried}).")

    def _pg_ctl(self, *args: str, mode: str | None = None):
        extra = ["-m", mode] if mode else []
        return self._tool(
            "pg_ctl", "-D", str(self.data), "-w", "-t", str(PG_CTL_WAIT_S), *extra, *args
        )

    def restart(self, mode: str = "fast") -> float:
        """`pg_ctl restart -m <mode>`; return how long the command took, in seconds."""
        started = time.monotonic()
        result = self._pg_ctl("restart", "-l", str(self.logfile), mode=mode)
        took = time.monotonic() - started
        self._check(result, f"pg_ctl restart -m {mode}")
        return took

    def destroy(self) -> None:
        """Stop the server at once (if it runs) and delete its directory; never raises."""
        with suppress(Exception):
            if (self.data / "postmaster.pid").exists():
                self._pg_ctl("stop", mode="immediate")
        shutil.rmtree(self.root, ignore_errors=True)

    # ------------------------------------------------------------- clients
    def server_log(self) -> str:
        try:
            return self.logfile.read_text(errors="replace")
        except OSError:
            return "(no server log)"

    def connect(self, dbname: str = "postgres") -> psycopg.Connection:
        return psycopg.connect(
            host=self.host, port=self.port, user=self.user, dbname=dbname, autocommit=True,
            connect_timeout=10,
        )

    def create_database(self, name: str) -> None:
        with self.connect() as conn:
            conn.execute(f'CREATE DATABASE "{name}"')

    def child_env(self, dbname: str) -> dict[str, str]:
        """Environment for a process running tests.settings against this cluster.

        tests/settings.py already reads PGHOST/PGPORT/PGUSER and, for child
        processes, CAIRNQ_CHILD_DB_NAME, so no settings change is needed.
        """
        env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
        env.update(
            CAIRNQ_TEST_DATABASE="postgres",
            CAIRNQ_CHILD_DB_NAME=dbname,
            DJANGO_SETTINGS_MODULE="tests.settings",
            PGHOST=self.host,
            PGPORT=str(self.port),
            PGUSER=self.user,
        )
        return env
