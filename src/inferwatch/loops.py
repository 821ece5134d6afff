"""Event loops run in a thread of their own (servers started in the background: tests, the demo, benchmarks).

A loop stopped but not closed keeps its selector (an epoll descriptor) and its self-pipe (a socket pair): three
open files until the garbage collector happens to break the loop's reference cycles, which in a long-running
process (or a test session starting hundreds of servers) may be never. Once its thread has ended, a loop is
closed at once.
"""

from __future__ import annotations

import asyncio
import threading


def close_stopped_loop(loop: asyncio.AbstractEventLoop | None, thread: threading.Thread | None) -> bool:
    """Close `loop` once `thread` (the one that ran it) has ended; True when it is closed now. A loop whose
    thread is still running (a stop that timed out) is left alone: closing a running loop raises, and its
    thread still owns it. Never raises."""
    if loop is None or loop.is_closed():
        return loop is not None
    if (thread is not None and thread.is_alive()) or loop.is_running():
        return False
    loop.close()
    return True
