"""ASGI middleware: meter the LLM routes of your own ASGI app (FastAPI, Starlette, ...) like the proxy does.

    app = GatewayMiddleware(app, Gateway(load_spec(), registry=prometheus_client.REGISTRY))

The request body is read before the app sees it (to find an OpenAI request's model) and replayed to the
app unchanged; response messages go to the server first and are metered after, through the same Exchange
the proxy uses. A send that fails (client gone) or a cancelled app counts as `cancelled`; an exception
from the app as `error` (code 500).
"""

from __future__ import annotations

import asyncio
import time

from inferwatch.exporters.gateway.api import Gateway


class GatewayMiddleware:
    def __init__(self, app, gateway: Gateway):
        self.app = app
        self.gateway = gateway

    async def __call__(self, scope, receive, send):
        # scope["path"] is what the app routes on, so it is what is classified (body-less first look).
        if scope["type"] != "http" or self.gateway.route(scope["method"], scope["path"]) is None:
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        messages = []
        parts = []
        while True:
            message = await receive()
            messages.append(message)
            if message["type"] != "http.request":
                break
            parts.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", ())}
        ex = self.gateway.exchange(scope["method"], scope["path"], headers, b"".join(parts), started)

        async def replay():
            return messages.pop(0) if messages else await receive()

        async def metered_send(message):
            kind = message["type"]
            if kind == "http.response.start":
                fields = {k.lower(): v.decode("latin-1") for k, v in message.get("headers", ())}
                ex.response_start(message["status"], fields.get(b"content-type"), fields.get(b"content-encoding"))
                await send(message)
            elif kind == "http.response.body":
                now = time.perf_counter()
                await send(message)
                ex.chunk(message.get("body", b""), now)
                if not message.get("more_body", False):
                    ex.finish()
            else:
                await send(message)

        try:
            await self.app(scope, replay, metered_send)
        except (asyncio.CancelledError, OSError):
            ex.finish("cancelled", ex.status or 499)
            raise
        except Exception:
            ex.finish("error", 500)
            raise
        finally:
            ex.finish("error", ex.status or 500)  # the app returned without finishing its response
