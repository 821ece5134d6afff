"""Parents for tests/test_process_lifetimes.py that the product's CLI cannot be made to be: run as
`python tests/lifetime_parents.py KIND`, each starts its children the product's way, prints one line
`ready PORT` (PORT 0 when it serves nothing) and then waits to be killed.

- `renderer`: the gateway's forked /metrics handler (exporters/gateway/exposition.py) on a real aiohttp
  server over a registry whose collector never returns, so a scrape leaves a render child running;
- `lifeline`: a ManagedProcess with `lifeline=True` (what `inferwatch demo` starts) running a shell with two
  children of its own, started from a thread that exits at once, as the demo's start-up threads do.
"""

from __future__ import annotations

import asyncio
import sys
import threading
from pathlib import Path


def renderer() -> None:
    from aiohttp import web
    from prometheus_client import CollectorRegistry

    from inferwatch.exporters.gateway.exposition import metrics_handler

    class Stuck:
        """A collector that never finishes: the render child stays until something kills it."""

        def describe(self):
            return []

        def collect(self):
            threading.Event().wait()
            yield from ()

    registry = CollectorRegistry()
    registry.register(Stuck())  # type: ignore[arg-type]
    app = web.Application()
    app.router.add_get("/metrics", metrics_handler(registry, forked=True))

    async def main() -> None:
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        print(f"ready {port}", flush=True)
        await asyncio.Event().wait()

    asyncio.run(main())


def lifeline(workdir: str) -> None:
    from inferwatch.testing.process import ManagedProcess

    started = threading.Event()

    def start() -> None:
        ManagedProcess("shell", ["sh", "-c", "sleep 600 & sleep 600 & wait"], Path(workdir) / "shell.log",
                       ready=lambda: True, lifeline=True).start()
        started.set()

    thread = threading.Thread(target=start)
    thread.start()
    thread.join()  # the thread that started it is gone: the lifeline must not depend on it
    assert started.is_set()
    print("ready 0", flush=True)
    threading.Event().wait()


if __name__ == "__main__":
    {"renderer": renderer, "lifeline": lambda: lifeline(sys.argv[2])}[sys.argv[1]]()
