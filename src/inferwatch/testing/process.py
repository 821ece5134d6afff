"""Start a real server as a child process on loopback, wait until it is ready, stop it cleanly.

Used by the test harness, the benchmarks and `inferwatch demo`, so all three start Triton, Prometheus and
Alertmanager the same way.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Callable, Sequence

import requests

from inferwatch.errors import StackError
from inferwatch.lifetime import lifeline_argv

log = logging.getLogger(__name__)


def free_port(host: str = "127.0.0.1") -> int:
    """An unused TCP port on `host` (the OS picks; tiny race window accepted for tests)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def require_binary(name: str, install_hint: str) -> str:
    """Absolute path of `name` on PATH, or StackError telling how to install it."""
    path = shutil.which(name)
    if not path:
        raise StackError(f"{name} not found on PATH; install it with: {install_hint}")
    return path


def http_ok(url: str, headers: dict | None = None, timeout: float = 1.0) -> bool:
    try:
        return requests.get(url, headers=headers, timeout=timeout).status_code == 200
    except requests.RequestException:
        return False


class ManagedProcess:
    """A child process whose stdout/stderr go to `log_path`, ready when `ready()` returns True.

    `lifeline=True` runs it under inferwatch.lifetime's supervisor, so it and everything it starts die
    when this process dies, however (SIGKILL included), and whichever thread started it; `proc` is then
    the supervisor (same process group, same exit status, stop signals forwarded), so read a program's own
    resources (/proc, psutil) only without it."""

    def __init__(self, name: str, argv: Sequence[str], log_path: Path, ready: Callable[[], bool],
                 env: dict | None = None, cwd: str | None = None, lifeline: bool = False,
                 user: str | None = None):
        """`user`: run as this system user (PostgreSQL refuses to run as root; needs a root parent)."""
        self.name = name
        self.user = user
        self.lifeline = lifeline
        self._lifeline_w: int | None = None
        self.argv = list(argv)
        self.log_path = Path(log_path)
        self._ready = ready
        self.env = env
        self.cwd = cwd
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 60.0) -> "ManagedProcess":
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log.info("starting %s: %s", self.name, " ".join(self.argv))
        logf = open(self.log_path, "ab")
        argv = self.argv
        pass_fds: tuple[int, ...] = ()
        if self.lifeline:
            self._close_lifeline()
            # Only this process holds the write end (pipes are close-on-exec): its death is the EOF.
            read_fd, self._lifeline_w = os.pipe()
            argv, pass_fds = lifeline_argv(self.argv, read_fd), (read_fd,)
        # A new session so that stop() can signal the whole process group (Triton's backend stubs too).
        try:
            self.proc = subprocess.Popen(argv, stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         env=self.env, cwd=self.cwd, start_new_session=True, pass_fds=pass_fds,
                                         user=self.user)
        finally:
            logf.close()
            for fd in pass_fds:
                os.close(fd)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self._close_lifeline()
                raise StackError(f"{self.name} exited with code {self.proc.returncode} during start-up; "
                                 f"last log lines:\n{self.tail()}")
            if self._ready():
                log.info("%s ready", self.name)
                return self
            time.sleep(0.2)
        self.stop()
        raise StackError(f"{self.name} not ready after {timeout:.0f}s; last log lines:\n{self.tail()}")

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def signal(self, sig: int) -> None:
        if self.running:
            self._send(sig)

    def kill(self) -> None:
        """SIGKILL the whole process group (a crash: no clean-up runs) and reap it; start() runs it again."""
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=10)
        log.info("%s killed (SIGKILL)", self.name)

    def stop(self, timeout: float = 15.0) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            try:
                self._send(signal.SIGTERM)
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=5)
            except ProcessLookupError:
                pass
        # Children left behind in the group (e.g. a Python backend stub) must not outlive the test.
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self._close_lifeline()
        log.info("%s stopped", self.name)

    def _send(self, sig: int) -> None:
        """`sig` to the process group; on a lifeline to the supervisor only, which forwards it (sent to the group
        as well, the program would get it twice)."""
        assert self.proc is not None
        if self.lifeline:
            os.kill(self.proc.pid, sig)
        else:
            os.killpg(self.proc.pid, sig)

    def _close_lifeline(self) -> None:
        if self._lifeline_w is not None:
            os.close(self._lifeline_w)
            self._lifeline_w = None

    def __enter__(self) -> "ManagedProcess":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
