"""A throwaway PostgreSQL server for tests and benchmarks: a real one, started from Debian's `postgresql` package.

The rule: one server per test session (or benchmark run), one fresh database per test. The server lives in a
directory of its own under the system's temporary directory (its data, its log and its Unix socket), listens on
that socket only (no TCP port: nothing else on the machine can reach it, nothing can collide with it), and is
stopped and removed when the `running()` block ends.

    with PostgresServer.running() as server:
        url = server.new_database()      # postgresql+psycopg://rollout@/test_1?host=/tmp/rollout-serve-pg-...

PostgreSQL refuses to run as root: under root (CI runs so) the server runs as the `postgres` user the Debian
package creates (else `nobody`), which owns the directory; root still reaches the socket. Its binaries are found
on PATH, else in /usr/lib/postgresql/<version>/bin (the newest), where the Debian package puts them
(`scripts/bootstrap` installs it). Durability is off (fsync, synchronous_commit): the data is thrown away.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import pwd
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

SUPERUSER = "rollout"
DEBIAN_BIN_DIRS = "/usr/lib/postgresql/*/bin"
START_TIMEOUT_S = 60
# Settings of a server whose data is thrown away: fast, and enough connections for tests that open many engines.
SERVER_CONF = {
    "listen_addresses": "''",
    "fsync": "off",
    "synchronous_commit": "off",
    "full_page_writes": "off",
    "max_connections": "300",
}


class PostgresUnavailable(RuntimeError):
    """PostgreSQL's server binaries are missing, or the server would not start (the message says which)."""


def find_bin_dir() -> Path:
    """The directory of initdb and pg_ctl: PATH first, then the newest Debian install."""
    on_path = shutil.which("pg_ctl")
    if on_path and shutil.which("initdb"):
        return Path(on_path).parent
    versions = sorted(Path("/").glob(DEBIAN_BIN_DIRS.lstrip("/")), key=_version_of, reverse=True)
    for bin_dir in versions:
        if (bin_dir / "pg_ctl").exists() and (bin_dir / "initdb").exists():
            return bin_dir
    raise PostgresUnavailable("PostgreSQL's server binaries (initdb, pg_ctl) are neither on PATH nor in "
                              f"{DEBIAN_BIN_DIRS}: run scripts/bootstrap (as root it installs Debian's postgresql "
                              "package), or `apt-get install postgresql`")


def _version_of(bin_dir: Path) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", bin_dir.parent.name)) or (0,)


@dataclass(frozen=True)
class _RunAs:
    """Who the server runs as: this process's user, or (under root) an unprivileged one."""

    user: str | None = None
    uid: int | None = None
    gid: int | None = None

    @classmethod
    def for_this_process(cls) -> _RunAs:
        if os.geteuid() != 0:
            return cls()
        for name in ("postgres", "nobody"):
            with contextlib.suppress(KeyError):
                entry = pwd.getpwnam(name)
                return cls(name, entry.pw_uid, entry.pw_gid)
        raise PostgresUnavailable("running as root, and neither a 'postgres' nor a 'nobody' user exists to run "
                                  "PostgreSQL as (it refuses root)")

    def run(self, argv: list[str], cwd: Path) -> subprocess.CompletedProcess:
        drop = {} if self.uid is None else {"user": self.uid, "group": self.gid, "extra_groups": []}
        return subprocess.run(argv, check=False, cwd=cwd, capture_output=True, text=True, env=_server_env(), **drop)

    def own(self, path: Path) -> None:
        if self.uid is not None:
            os.chown(path, self.uid, self.gid)


def _server_env() -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith("PG")}
    env["LC_ALL"] = "C"
    return env


class PostgresServer:
    """A running throwaway server (module docstring); `running()` starts it and removes it."""

    def __init__(self, root: Path, bin_dir: Path, run_as: _RunAs):
        self.root = root
        self.bin_dir = bin_dir
        self.run_as = run_as
        self._database_numbers = itertools.count(1)

    @property
    def data_dir(self) -> Path:
        return self.root / "data"

    @property
    def log_file(self) -> Path:
        return self.root / "server.log"

    @classmethod
    @contextlib.contextmanager
    def running(cls) -> Iterator[PostgresServer]:
        bin_dir, run_as = find_bin_dir(), _RunAs.for_this_process()
        root = Path(tempfile.mkdtemp(prefix="rollout-serve-pg-"))   # 0700; the socket path stays short
        server = cls(root, bin_dir, run_as)
        try:
            run_as.own(root)
            server._init_and_start()
            yield server
        finally:
            server._stop()
            shutil.rmtree(root, ignore_errors=True)

    def url(self, database: str = "postgres") -> str:
        """A SQLAlchemy URL of one database of this server, over its Unix socket."""
        return f"postgresql+psycopg://{SUPERUSER}@/{database}?host={self.root}"

    def new_database(self, prefix: str = "test") -> str:
        """Creates an empty database and returns its URL."""
        import psycopg

        name = f"{prefix}_{next(self._database_numbers)}"
        with psycopg.connect(host=str(self.root), user=SUPERUSER, dbname="postgres", autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def _init_and_start(self) -> None:
        self._run("initdb", "-D", str(self.data_dir), "--username", SUPERUSER, "--auth", "trust",
                  "--encoding", "UTF8", "--locale", "C", "--no-sync")
        conf = dict(SERVER_CONF, unix_socket_directories=f"'{self.root}'")
        with open(self.data_dir / "postgresql.conf", "a") as handle:
            handle.writelines(f"{key} = {value}\n" for key, value in conf.items())
        self._run("pg_ctl", "start", "-D", str(self.data_dir), "-l", str(self.log_file), "-w",
                  "-t", str(START_TIMEOUT_S))

    def _stop(self) -> None:
        if (self.data_dir / "postmaster.pid").exists():
            self.run_as.run([str(self.bin_dir / "pg_ctl"), "stop", "-D", str(self.data_dir), "-m", "fast", "-w"],
                            cwd=self.root)

    def _run(self, program: str, *args: str) -> None:
        done = self.run_as.run([str(self.bin_dir / program), *args], cwd=self.root)
        if done.returncode != 0:
            log_tail = self.log_file.read_text()[-4000:] if self.log_file.exists() else ""
            who = f" as user {self.run_as.user}" if self.run_as.user else ""
            raise PostgresUnavailable(f"{program}{who} failed ({done.returncode}):\n{done.stdout}{done.stderr}"
                                      f"{log_tail}")
