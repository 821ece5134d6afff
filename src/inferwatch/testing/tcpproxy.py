"""A round-robin TCP proxy on loopback: what a Kubernetes ClusterIP Service (kube-proxy) or a TCP load balancer
does to clients, one backend per connection in turn. Tests put it in front of several real servers.

    with RoundRobinProxy([("127.0.0.1", 8000), ("127.0.0.1", 8001)]) as proxy:
        requests.get(f"http://127.0.0.1:{proxy.port}/v2/health/live")

`connections` counts accepted connections per backend index.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import threading
from collections import Counter

from inferwatch.loops import close_stopped_loop


class RoundRobinProxy:
    """Listens on `host`:`port` (0: a free port) and pipes each accepted connection to the next backend of
    `backends` ((host, port) pairs) in turn. Runs its own event loop in a daemon thread; `close()` stops it."""

    def __init__(self, backends: list[tuple[str, int]], host: str = "127.0.0.1", port: int = 0):
        self.backends = list(backends)
        self.host = host
        self.connections: Counter[int] = Counter()
        self._next = itertools.cycle(range(len(self.backends)))
        self._writers: set[asyncio.StreamWriter] = set()  # both sides of every open connection
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="tcp-proxy", daemon=True)
        self._thread.start()
        self._server = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._handle, host, port), self._loop).result(10)
        self.port: int = self._server.sockets[0].getsockname()[1]

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        index = next(self._next)
        self.connections[index] += 1
        self._writers.add(writer)
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.backends[index])
        except OSError:
            self._writers.discard(writer)
            writer.close()
            return
        self._writers.add(up_writer)
        try:
            await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
        finally:
            self._writers.difference_update((writer, up_writer))

    def close(self) -> None:
        async def stop() -> None:
            self._server.close()
            await self._server.wait_closed()
            # Python 3.11's wait_closed() does not wait for the connections: close both sides of each, and let
            # the loop run their connection_lost before it stops (a transport left open keeps its socket until
            # the garbage collector finds it).
            for writer in list(self._writers):
                writer.close()
            for writer in list(self._writers):
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(writer.wait_closed(), 5)

        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        close_stopped_loop(self._loop, self._thread)

    def __enter__(self) -> RoundRobinProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(Exception):
            writer.close()
