"""Children that never outlive their parent, however the parent dies (SIGKILL, the OOM killer, a node drain).

A parent killed with SIGKILL runs no clean-up, so every child the product starts must notice by itself. Two
mechanisms, both used:

- the kernel's parent-death signal (Linux `prctl(PR_SET_PDEATHSIG)`, prctl(2)): the child gets SIGKILL the
  moment its parent dies. Caveat from prctl(2): "parent" is the *thread* that created the child, so it is
  armed only in children created by a thread that lives as long as its process (a forked gateway worker, the
  forked /metrics renderer, a send process spawned by a notifier thread that lives until the pool closes,
  the single-threaded lifeline below);
- a portable liveness check: the parent's pid, read by the parent before it starts the child, compared with
  `os.getppid()` (which changes when the child is re-parented), once right after arming the signal (the
  parent may already be gone: prctl(2) recommends that check) and then every `PARENT_POLL_S`; or a pipe whose
  write end only the parent holds, whose EOF means the parent is gone.

Programs we do not write (tritonserver, Prometheus, Alertmanager) cannot run either check, so
`python -m inferwatch.lifetime FD -- ARGV...` (`lifeline_argv`) runs them under a small single-threaded
supervisor: it arms the parent-death signal in the program it starts, forwards the stop signals, and when
FD reaches EOF (the real parent is gone, whatever thread started it) SIGKILLs its process group and exits.
"""

from __future__ import annotations

import ctypes
import os
import select
import signal
import sys
import threading
import time

PARENT_POLL_S = 0.5  # the liveness check's period: an orphan outlives its parent by at most about this
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
# libc's symbols, resolved once in the parent: a forked child must not look a library up (find_library runs
# a program) and only calls prctl through this handle.
_LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None
_FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)


def set_parent_death_signal(sig: int = signal.SIGKILL) -> bool:
    """Ask the kernel to send `sig` to this process when the thread that created it exits (Linux only).
    Returns False where prctl(2) does not exist or refuses; never raises."""
    if _LIBC is None:
        return False
    try:
        return _LIBC.prctl(_PR_SET_PDEATHSIG, ctypes.c_ulong(int(sig)), 0, 0, 0) == 0
    except AttributeError:
        return False


def die_with_parent(parent_pid: int, watch: bool = True, code: int = 0) -> None:
    """Call first thing in a child whose parent is `parent_pid` (read by the parent before it started the
    child, never by the child: a child that reads its parent late reads the adoptive one): arms the
    parent-death signal, leaves at once (`os._exit(code)`) when the parent is already gone, and with `watch`
    starts a daemon thread that leaves the same way within PARENT_POLL_S of the parent's death (the portable
    check, for kernels without the signal and for a parent thread that exited)."""
    set_parent_death_signal(signal.SIGKILL)
    if os.getppid() != parent_pid:
        os._exit(code)
    if watch:
        threading.Thread(target=_watch_parent, args=(parent_pid, code), name="parent-watch", daemon=True).start()


def _watch_parent(parent_pid: int, code: int) -> None:
    while os.getppid() == parent_pid:
        time.sleep(PARENT_POLL_S)
    os._exit(code)


def lifeline_argv(argv: list[str], fd: int) -> list[str]:
    """`argv` run under the lifeline supervisor watching `fd` (the read end of a pipe whose write end only
    the parent holds; pass it with `pass_fds`)."""
    return [sys.executable, "-m", "inferwatch.lifetime", str(fd), "--", *argv]


def _supervise(fd: int, argv: list[str]) -> int:
    """The lifeline supervisor (see the module docstring). Returns the program's exit code; a program killed
    by a signal is reported by dying of the same signal."""
    me = os.getpid()
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # only to wake the select below
    child = os.fork()
    if child == 0:
        try:
            set_parent_death_signal(signal.SIGKILL)  # this supervisor is single-threaded: safe to arm here
            if os.getppid() != me:
                os._exit(1)
            for sig in (*_FORWARDED, signal.SIGCHLD):
                signal.signal(sig, signal.SIG_DFL)
            signal.set_wakeup_fd(-1)
            os.execvp(argv[0], argv)  # noqa: S606 - the program the caller asked for, as an argv (no shell)
        except BaseException as exc:  # noqa: BLE001 - the child must never return into the supervisor's code
            os.write(2, f"inferwatch lifeline: cannot run {argv[0]}: {exc}\n".encode())
        os._exit(127)

    def forward(sig: int, _frame) -> None:
        try:
            os.kill(child, sig)
        except ProcessLookupError:
            pass

    for sig in _FORWARDED:
        signal.signal(sig, forward)
    os.set_blocking(fd, False)
    # poll(2), not select(2): a parent with more than FD_SETSIZE (1024) files open hands down a higher fd
    # number, which select() refuses (ValueError).
    poller = select.poll()
    for watched in (fd, wake_r):
        poller.register(watched, select.POLLIN)
    while True:
        done, status = os.waitpid(child, os.WNOHANG)
        if done:
            break
        try:
            readable = {ready for ready, _ in poller.poll(PARENT_POLL_S * 1000)}
        except InterruptedError:
            continue
        if wake_r in readable:
            os.read(wake_r, 512)
        if fd in readable:
            try:
                data = os.read(fd, 512)
            except BlockingIOError:
                data = b"x"
            if not data:  # the parent is gone: nothing may outlive it
                if os.getpgrp() == me:
                    os.killpg(me, signal.SIGKILL)  # the program and whatever it started; this process too
                os.kill(child, signal.SIGKILL)
                os._exit(1)
    if os.WIFSIGNALED(status):
        died_of = os.WTERMSIG(status)
        signal.signal(died_of, signal.SIG_DFL)
        os.kill(me, died_of)
        return 128 + died_of
    return os.waitstatus_to_exitcode(status)


def main(args: list[str]) -> int:
    if len(args) < 3 or args[1] != "--" or not args[0].isdigit():
        print("usage: python -m inferwatch.lifetime FD -- PROGRAM [ARGS...]", file=sys.stderr)
        return 2
    return _supervise(int(args[0]), args[2:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
