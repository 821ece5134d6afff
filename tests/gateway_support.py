"""Test support for the gateway exporter: the real proxy on its own event loop thread, and a local
OpenAI-compatible SSE upstream speaking the documented stream format (research/llm_metrics.md §6.2)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import socket
import threading
import time

from aiohttp import web

from inferwatch.exporters.gateway.api import Gateway
from inferwatch.exporters.gateway.proxy import Proxy
from inferwatch.exporters.gateway.server import serve
from inferwatch.spec import spec_from_dict

TEST_SPEC = {
    "tenants": ["acme", "globex"],
    "models": ["toy_llm", "gpt-test"],
    "tiers": {"realtime": {"services": ["chat-web"]}, "batch": {"services": ["nightly-batch"]}},
}


def make_spec(**gateway):
    data = dict(TEST_SPEC)
    if gateway:
        data["gateway"] = gateway
    return spec_from_dict(data)


class LoopThread:
    """An asyncio loop in a daemon thread; `run(coro)` blocks on a coroutine scheduled there."""

    def __init__(self):
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro, timeout=30):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self):
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=5)


class RunningProxy:
    """The gateway proxy (real aiohttp server and client) in front of `upstream`, on loopback ports the OS
    picks when the server binds (port 0), so no port can be taken between choosing and binding it."""

    def __init__(self, upstream: str, spec=None, ports: tuple[int, int] = (0, 0)):
        self.usages = []
        self.gateway = Gateway(spec if spec is not None else make_spec(), usage_sink=self.usages.append)
        self.proxy = Proxy(self.gateway, upstream)
        self._lt = LoopThread()
        self._stop = self._lt.run(_make_event())
        ready = concurrent.futures.Future()
        self._task = asyncio.run_coroutine_threadsafe(
            serve(self.proxy, "127.0.0.1", *ports, stop=self._stop,
                  on_ready=lambda port, metrics_port: ready.set_result((port, metrics_port))), self._lt.loop)
        self.port, self.metrics_port = _wait_ready(ready, self._task, "proxy listening", self._lt)
        self.url = f"http://127.0.0.1:{self.port}"
        self.metrics_url = f"http://127.0.0.1:{self.metrics_port}/metrics"

    def value(self, name: str, **labels) -> float:
        return self.gateway.metrics.registry.get_sample_value(name, labels) or 0.0

    def requests_total(self, **labels) -> float:
        """Sum of gateway_requests_total over the series matching `labels`."""
        total = 0.0
        for metric in self.gateway.metrics.registry.collect():
            for s in metric.samples:
                if s.name == "gateway_requests_total" and all(s.labels.get(k) == v for k, v in labels.items()):
                    total += s.value
        return total

    def wait_requests(self, n: int, **labels) -> None:
        wait_until(lambda: self.requests_total(**labels) >= n, what=f"{n} finished requests {labels}")

    def stop(self):
        self._lt.loop.call_soon_threadsafe(self._stop.set)
        self._task.result(timeout=15)
        self._lt.close()


async def _make_event():
    return asyncio.Event()


def _wait_ready(ready: concurrent.futures.Future, task: concurrent.futures.Future, what: str, lt: LoopThread):
    """The value `ready` gets, or the serving task's own exception (e.g. a bind failure) at once if the task
    ends first. The bound only keeps a broken build from hanging."""
    done, _ = concurrent.futures.wait([ready, task], timeout=30, return_when=concurrent.futures.FIRST_COMPLETED)
    if ready in done:
        return ready.result()
    lt.close()
    if task in done:
        task.result()  # raises the serving task's exception, with its traceback
        raise AssertionError(f"serving task ended before {what}")
    raise AssertionError(f"timed out waiting for {what}")


@contextlib.contextmanager
def refused_port():
    """A loopback port that refuses connections while the block runs: bound, so nobody else can take it,
    and not listening."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield s.getsockname()[1]


def wait_until(predicate, timeout: float = 15.0, what: str = "condition") -> None:
    """Wait for a condition the system reaches asynchronously (not a timing assertion: the bound only
    keeps a broken build from hanging)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


# --------------------------------------------------------------------------- OpenAI-format SSE upstream
def chat_chunk(content=None, *, role=None, finish=None, usage="null", logprobs=None) -> bytes:
    delta = {}
    if role:
        delta["role"] = role
    if content is not None:
        delta["content"] = content
    choice = {"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
    doc = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "gpt-test",
           "choices": [choice]}
    if usage != "null":
        doc["usage"] = usage
    else:
        doc["usage"] = None
    return b"data: " + json.dumps(doc).encode() + b"\n\n"


def usage_chunk(prompt: int, completion: int) -> bytes:
    doc = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "gpt-test",
           "choices": [], "usage": {"prompt_tokens": prompt, "completion_tokens": completion,
                                    "total_tokens": prompt + completion}}
    return b"data: " + json.dumps(doc).encode() + b"\n\n"


DONE = b"data: [DONE]\n\n"


class OpenAIUpstream:
    """Answers POST /v1/chat/completions with a scripted stream: `script` is a list of bytes (written and
    flushed one by one) and the special items ("sleep", s) and ("cut",) (drop the connection mid-stream).
    Non-streamed bodies (`"stream": false`) get `non_stream_body`."""

    def __init__(self):
        self.script: list = []
        self.non_stream_body: dict = {}
        self.bodies: list[dict] = []
        self._lt = LoopThread()
        self._runner = self._lt.run(self._start())
        self.port = self._runner.addresses[0][1]  # port 0 bound: the OS picked a free one
        self.url = f"http://127.0.0.1:{self.port}"

    async def _start(self):
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._handle)
        app.router.add_post("/v1/completions", self._handle)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        return runner

    async def _handle(self, request: web.Request):
        body = await request.json()
        self.bodies.append(body)
        if not body.get("stream"):
            return web.json_response(self.non_stream_body)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for item in self.script:
            if isinstance(item, tuple) and item[0] == "sleep":
                await asyncio.sleep(item[1])
            elif isinstance(item, tuple) and item[0] == "cut":
                request.transport.close()
                return resp
            else:
                await resp.write(item)
        await resp.write_eof()
        return resp

    def stop(self):
        self._lt.run(self._runner.cleanup())
        self._lt.close()
