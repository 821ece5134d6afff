"""Real PostgreSQL (Debian package `postgresql`) on loopback, for tests and benchmarks: a fresh cluster in a
temporary data folder, password authentication over TCP, fast restart on demand.

Debian installs the server programs in /usr/lib/postgresql/<version>/bin, not on PATH. PostgreSQL refuses
to run as root, so as root initdb and postgres run as the `postgres` system user the package creates, with
the data folder handed to it.
"""

from __future__ import annotations

import dataclasses
import glob
import os
import pwd
import secrets
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

from inferwatch.testing.process import ManagedProcess, StackError, free_port

INSTALL_HINT = "apt-get update && apt-get install -y postgresql  (or: make test, which installs it)"
USER = "inferwatch"  # the cluster's superuser, with a password (scram-sha-256 over TCP)


def find_bin_dir() -> Path:
    """The newest /usr/lib/postgresql/<version>/bin holding initdb and postgres (else PATH's initdb's
    folder). Raises StackError with the install hint when there is none."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"),
                   key=lambda p: [int(x) for x in Path(p).parent.parent.name.split(".") if x.isdigit()])
    if found:
        return Path(found[-1]).parent
    on_path = shutil.which("initdb")
    if on_path and Path(on_path).with_name("postgres").exists():
        return Path(on_path).parent
    raise StackError(f"PostgreSQL server programs not found in /usr/lib/postgresql/*/bin; install: {INSTALL_HINT}")


@dataclasses.dataclass
class PostgresServer:
    process: ManagedProcess
    port: int
    password: str
    data_dir: Path
    host: str = "127.0.0.1"
    user: str = USER

    def url(self, database: str = "postgres") -> str:
        """postgresql://user@host:port/database, without the password (given separately, as the spec does)."""
        return f"postgresql://{self.user}@{self.host}:{self.port}/{database}"

    def connect(self, database: str = "postgres"):
        import psycopg

        return psycopg.connect(self.url(database), password=self.password, autocommit=True, connect_timeout=5)

    def create_database(self, name: str) -> str:
        """A new empty database; returns its URL."""
        with self.connect() as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def ready(self) -> bool:
        try:
            with self.connect():
                return True
        except Exception:  # noqa: BLE001 - not accepting connections yet (starting, recovering)
            return False

    def stop_fast(self, timeout: float = 30.0) -> None:
        """Fast shutdown (SIGINT): clients are disconnected, every commit is kept. SIGTERM would wait for
        every client to leave."""
        if self.process.proc is None or not self.process.running:
            return
        self.process.signal(signal.SIGINT)
        try:
            self.process.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pass
        self.process.stop()

    def start(self, timeout: float = 60.0) -> None:
        self.process.start(timeout=timeout)

    def restart_fast(self, timeout: float = 60.0) -> None:
        self.stop_fast()
        self.start(timeout)

    def stop(self) -> None:
        """Stop the server and remove its data folder."""
        self.stop_fast()
        shutil.rmtree(self.data_dir, ignore_errors=True)


def start_postgres(workdir: Path, *, port: int | None = None, timeout: float = 60.0,
                   name: str = "postgres", fsync: bool = False) -> PostgresServer:
    """initdb a cluster in a fresh temporary folder (removed by stop()) and start it on a free loopback port;
    ready when a password login succeeds. `fsync`: commits flushed to disk (benchmarks: a durable commit's
    cost); off for tests, which lose no power. Raises StackError (install hint, or the server's last log lines) on
    failure."""
    bindir = find_bin_dir()
    workdir = Path(workdir)
    run_as = None
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            raise StackError("running as root and there is no `postgres` system user; install: "
                             f"{INSTALL_HINT}") from None
        run_as = "postgres"
    # The cluster's own folder, outside `workdir`: pytest's folders are root's alone (mode 0700), which the
    # postgres user cannot enter. The log stays in `workdir` (written through a descriptor root opens).
    home = Path(tempfile.mkdtemp(prefix=f"inferwatch-{name}-"))
    data, sockets, pwfile = home / "data", home / "sockets", home / "password"
    password = secrets.token_hex(16)
    for d in (data, sockets):
        d.mkdir(mode=0o700)
    pwfile.write_text(password + "\n")
    if run_as:
        for p in (home, data, sockets, pwfile):
            shutil.chown(p, user=run_as)
    init = subprocess.run([str(bindir / "initdb"), "-D", str(data), "-U", USER, f"--pwfile={pwfile}",
                           "--auth-host=scram-sha-256", "--auth-local=trust", "-E", "UTF8", "--no-sync"],
                          capture_output=True, text=True, user=run_as, timeout=timeout)
    pwfile.unlink()
    if init.returncode != 0:
        shutil.rmtree(home, ignore_errors=True)
        raise StackError(f"initdb failed ({init.returncode}): {init.stderr.strip()[-2000:]}")
    port = port or free_port()
    argv = [str(bindir / "postgres"), "-D", str(data), "-p", str(port), "-c", "listen_addresses=127.0.0.1",
            "-c", f"unix_socket_directories={sockets}",
            # fsync off keeps tests fast on a busy machine; commits still wait for the WAL write, and a fast
            # restart keeps every commit.
            "-c", f"fsync={'on' if fsync else 'off'}", "-c", "max_connections=200"]
    server = PostgresServer(ManagedProcess(name, argv, workdir / f"{name}.log", ready=lambda: False, user=run_as),
                            port, password, home)
    server.process._ready = server.ready
    try:
        server.start(timeout)
    except BaseException:
        shutil.rmtree(home, ignore_errors=True)
        raise
    return server

