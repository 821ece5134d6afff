"""Test support for the gateway exporter: the real proxy on its own event loop thread, and a local
OpenAI-compatible SSE upstream speaking the documented stream format (docs/sources.md#llm-user-experience-metrics)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import http.client
import io
import json
import socket
import threading
import time

from aiohttp import web

from inferwatch.exporters.gateway.api import Gateway
from inferwatch.exporters.gateway.proxy import Proxy
from inferwatch.exporters.gateway.server import serve
from inferwatch.loops import close_stopped_loop
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
        close_stopped_loop(self.loop, self.thread)  # its epoll and self-pipe, not left to the collector


class RunningProxy:
    """The gateway proxy (real aiohttp server and client) in front of `upstream`, on loopback ports the OS
    picks when the server binds (port 0), so no port can be taken between choosing and binding it."""

    def __init__(self, upstream: str, spec=None, ports: tuple[int, int] = (0, 0), grpc_upstream: str | None = None,
                 **grpc_options):
        self.usages = []
        self.gateway = Gateway(spec if spec is not None else make_spec(), usage_sink=self.usages.append)
        self.proxy = Proxy(self.gateway, upstream)
        # With `grpc_upstream` (host:port) the gRPC listener serves too, on a port the OS picks (grpc_port).
        self.grpc = None
        if grpc_upstream is not None:
            from inferwatch.exporters.gateway.grpcproxy import GrpcProxy

            self.grpc = GrpcProxy(self.gateway, grpc_upstream, **grpc_options)
        self._lt = LoopThread()
        self._stop = self._lt.run(_make_event())
        ready = concurrent.futures.Future()
        self._task = asyncio.run_coroutine_threadsafe(
            # In place: this test process's own thread reads the registry too (value()), which a forked render
            # must not meet mid-read; GatewayProcess tests cover the forked render of the CLI.
            serve(self.proxy, "127.0.0.1", *ports, stop=self._stop, forked_metrics=False,
                  on_ready=lambda port, metrics_port: ready.set_result((port, metrics_port)),
                  grpc_proxy=self.grpc), self._lt.loop)
        self.port, self.metrics_port = _wait_ready(ready, self._task, "proxy listening", self._lt)
        self.grpc_address = f"127.0.0.1:{self.grpc.port}" if self.grpc is not None else None
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
        await play(request, resp, self.script, time.monotonic())
        return resp

    def stop(self):
        self._lt.run(self._runner.cleanup())
        self._lt.close()


# --------------------------------------------------------------------- the real gateway process (CLI)
class Samples:
    """The samples of one scrape, looked up by name and exact labels."""

    def __init__(self, samples: list):
        self._by_key = {(s.name, frozenset(s.labels.items())): s.value for s in samples}

    def value(self, name: str, **labels) -> float | None:
        """The sample's value, or None when the scrape had no such sample (absent is not 0)."""
        return self._by_key.get((name, frozenset(labels.items())))


class GatewayProcess:
    """`inferwatch -v exporter gateway` as a child process (the real CLI, uvloop and all) in front of
    `upstream`, with `spec` (a dict) written to a file, a usage log, and all its output in one log file."""

    def __init__(self, upstream: str, spec: dict, workdir, verbose: bool = True, extra_args: tuple = (),
                 env: dict | None = None, launcher: list[str] | None = None):
        """`launcher`: argv that runs the interpreter with the arguments after it (e.g. after lowering a limit)."""
        import sys

        import yaml

        from inferwatch.testing.process import ManagedProcess, free_port, http_ok

        self.workdir = workdir
        spec_path = workdir / "gateway.yaml"
        spec_path.write_text(yaml.safe_dump(spec))
        self.usage_path = workdir / "usage.jsonl"
        self.log_path = workdir / "gateway.log"
        self.port, self.metrics_port = free_port(), free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.metrics_url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        argv = [sys.executable, "-m", "inferwatch.cli"] + (["-v"] if verbose else []) + [
            "exporter", "gateway", "--upstream", upstream, "--port", str(self.port),
            "--metrics-port", str(self.metrics_port), "--spec", str(spec_path), "--usage-log", str(self.usage_path),
            *extra_args]
        if launcher:
            argv = [*launcher, *argv[1:]]
        self.process = ManagedProcess("gateway", argv, self.log_path, ready=lambda: http_ok(self.metrics_url),
                                      env=env)
        self.process.start(timeout=60)
        self.pid = self.process.proc.pid

    def samples(self) -> list:
        """Every sample /metrics exposes now (prometheus_client's own parser)."""
        from prometheus_client.parser import text_string_to_metric_families

        text = requests_get(self.metrics_url).text
        return [s for family in text_string_to_metric_families(text) for s in family.samples]

    def value(self, name: str, **labels) -> float | None:
        """The sample's value, or None when /metrics has no such sample (absent is not 0)."""
        return self.snapshot().value(name, **labels)

    def snapshot(self) -> "Samples":
        """One scrape of /metrics, for several reads of values that no longer move (a finished request's):
        each scrape renders and parses every series of the process (about 2,000 lines, half a second on a
        busy machine)."""
        return Samples(self.samples())

    def usages(self, **match) -> list[dict]:
        """Usage-log records whose fields equal `match`, from complete lines only: a read racing the gateway's
        write can end inside a record (the kernel copies a write across a page boundary in steps), and that
        record is read whole on the next call."""
        if not self.usage_path.exists():
            return []
        complete = self.usage_path.read_text().rpartition("\n")[0]
        rows = [json.loads(line) for line in complete.splitlines() if line.strip()]
        return [r for r in rows if all(r.get(k) == v for k, v in match.items())]

    def wait_usage(self, **match) -> dict:
        """The one usage record matching `match`, once the gateway has written it."""
        wait_until(lambda: len(self.usages(**match)) >= 1, what=f"usage record {match}")
        found = self.usages(**match)
        assert len(found) == 1, found
        return found[0]

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def memory_kib(self) -> dict[str, int]:
        """VmRSS (now) and VmHWM (peak resident set) of the gateway process, in KiB (Linux /proc)."""
        out = {}
        for line in open(f"/proc/{self.pid}/status"):
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out[key] = int(value.split()[0])
        return out

    def stop(self) -> None:
        self.process.stop()


# ------------------------------------------------------------- answers read off one raw connection
class _Kept(io.BufferedReader):
    def close(self):  # http.client closes the file after each answer; the next one is read from it too
        pass


class _Sock:
    """What http.client.HTTPResponse reads from: one buffered file for the whole connection, so answers that
    follow each other on it (keep-alive, pipelining) are read in turn."""

    def __init__(self, sock: socket.socket):
        self.file = _Kept(socket.SocketIO(sock, "rb"))

    def makefile(self, *_args, **_kw):
        return self.file


def answers(sock: socket.socket, methods: list[str]) -> list[tuple[int, dict, bytes]]:
    """Read one answer per method from `sock`: (status, headers lower-cased, body)."""
    reader = _Sock(sock)
    out = []
    for method in methods:
        resp = http.client.HTTPResponse(reader, method=method)
        resp.begin()
        out.append((resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()))
    return out



def raw_post(path: str, script: str, body: dict, close: bool = False) -> bytes:
    """A POST of `body` as JSON, as tenant `script` with script `script` (ScriptedUpstream), for a raw socket
    (pipelining); `close` asks the server to close the connection after answering it."""
    data = json.dumps(body).encode()
    return (b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nX-Tenant-ID: %s\r\n"
            b"X-Script: %s\r\nContent-Length: %d\r\n%s\r\n%s"
            % (path.encode(), script.encode(), script.encode(), len(data),
               b"Connection: close\r\n" if close else b"", data))


def requests_get(url: str, **kw):
    import requests

    return requests.get(url, timeout=10, **kw)


# ------------------------------------------------------------------------ a scripted local upstream
class ScriptedUpstream:
    """An HTTP upstream that answers any path with a script chosen by the request's `X-Script` header.

    A script is `Script(status, headers, items)`; items are bytes (written and flushed one by one),
    ("at", s) (wait until s seconds after the request arrived), ("cut",) (drop the connection without
    ending the body) and ("bulk", n, piece) (write `piece` until n bytes have gone, as fast as the
    reader takes them). Each request's method, raw path and headers (`headers` a dict, `header_list` every
    field as sent) are kept in `received`, with `started` (time.monotonic() when the request reached the
    handler) and `sent` (one (time.monotonic() before the write, body bytes written through it) per bytes or
    bulk item): the upstream runs in the test process, and Linux's monotonic clock is system-wide, so these
    instants compare with the test's own and bound the gateway's (see Timing).
    """

    def __init__(self):
        self.scripts: dict[str, Script] = {}
        self.received: list[dict] = []
        self._lt = LoopThread()
        self._runner = self._lt.run(self._start())
        self.port = self._runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{self.port}"

    async def _start(self):
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        return runner

    async def _handle(self, request: web.Request):
        t0 = time.monotonic()
        await request.read()
        sent: list[tuple[float, int]] = []
        self.received.append({"method": request.method, "raw_path": request.raw_path,
                              "headers": dict(request.headers), "header_list": list(request.headers.items()),
                              "started": t0, "sent": sent})
        script = self.scripts.get(request.headers.get("X-Script", ""))
        if script is None:
            return web.Response(status=404, text="no script")
        if script.delay:
            await asyncio.sleep(script.delay)
        resp = web.StreamResponse(status=script.status, headers=script.headers)
        if script.length is not None:
            resp.content_length = script.length
        await resp.prepare(request)
        if request.method == "HEAD":  # the answer to HEAD has no body (RFC 9110 §9.3.2)
            await resp.write_eof()
        else:
            await play(request, resp, script.items, t0, sent)
        return resp

    def request(self, script: str) -> dict:
        """The last request received for script `script` (its `received` record)."""
        found = [r for r in self.received if r["headers"].get("X-Script") == script]
        assert found, f"no request for script {script!r}"
        return found[-1]

    def stop(self):
        self._lt.run(self._runner.cleanup())
        self._lt.close()


async def play(request: web.Request, resp: web.StreamResponse, items, t0: float,
               sent: list | None = None) -> None:
    """Write a script's items (see ScriptedUpstream; ("sleep", s) waits s seconds) and end the body, or cut
    the connection at ("cut",). With `sent`, append (time.monotonic() before the item's first write, body
    bytes written once it is done) for each bytes or bulk item."""
    offset = 0
    for item in items:
        if isinstance(item, tuple) and item[0] == "at":
            delay = t0 + item[1] - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
        elif isinstance(item, tuple) and item[0] == "sleep":
            await asyncio.sleep(item[1])
        elif isinstance(item, tuple) and item[0] == "cut":
            request.transport.close()
            return
        elif isinstance(item, tuple) and item[0] == "bulk":
            left, piece = item[1], item[2]
            at = time.monotonic()
            while left > 0:
                part = piece[:left]
                await resp.write(part)
                left -= len(part)
            offset += item[1]
            if sent is not None:
                sent.append((at, offset))
        else:
            at = time.monotonic()
            offset += len(item)
            if sent is not None:
                sent.append((at, offset))
            await resp.write(item)
    await resp.write_eof()


class Script:
    """What the upstream answers: `status`, headers, body `items` (see ScriptedUpstream); `length` sets
    Content-Length (else the body is chunked); `delay` seconds pass before the status line is sent."""

    def __init__(self, items, status: int = 200, content_type: str = "text/event-stream",
                 headers: dict | None = None, length: int | None = None, delay: float = 0.0):
        self.items = list(items)
        self.delay = delay
        self.status = status
        self.headers = {"Content-Type": content_type, **(headers or {})}
        self.length = length

    def body(self) -> bytes:
        """The bytes the script writes (what the client must receive unchanged)."""
        return b"".join(i for i in self.items if isinstance(i, bytes))


def through(gw: GatewayProcess, row: str, path: str, body: dict, headers: dict | None = None):
    """POST `body` to `path` through the gateway process as tenant `row` with script `row`.

    Returns (status, response headers, raw body bytes as received, or None when the stream was cut)."""
    import requests
    import urllib3

    hdrs = {"X-Tenant-ID": row, "X-Script": row, **(headers or {})}
    with requests.post(gw.url + path, json=body, headers=hdrs, stream=True, timeout=30) as resp:
        try:
            raw = resp.raw.read(decode_content=False)
        except (urllib3.exceptions.ProtocolError, requests.exceptions.ChunkedEncodingError):
            raw = None
        return resp.status_code, resp.headers, raw


def chunk(delta: dict | None = None, finish=None, index: int = 0, text=None, **extra) -> bytes:
    """One OpenAI-format chunk's JSON (no framing): chat `delta`, or completions `text`."""
    choice = {"index": index, "finish_reason": finish}
    if text is not None:
        choice["text"] = text
    else:
        choice["delta"] = delta or {}
    return json.dumps({"object": "chat.completion.chunk", "choices": [choice], **extra}).encode()


# ------------------------------------------------- timing bounds that hold on a machine under any load
CLOCK_SLACK = 0.002  # seconds: float sums in the histogram and clock reads a few instructions apart


class Timing:
    """When each body write of one scripted request left the upstream and reached the client, on the
    system-wide monotonic clock, so a test can bound what the gateway measured without a fixed window.

    The gateway starts its clock when the request's head is parsed (after the client's `client_start`,
    before the upstream's `upstream_start`) and stamps a read before it writes the read to the client, so
    it saw write k at an instant in [sent_at(k), arrived_at(k)]. Writes are numbered as in `sent` (each
    bytes or bulk item of the script, in order)."""

    def __init__(self, record: dict, client_start: float, reads: list[tuple[float, int]]):
        self.upstream_start = record["started"]
        self.sent = list(record["sent"])
        self.client_start = client_start
        self.reads = reads  # (time.monotonic() after the read, body bytes received through it)

    def sent_at(self, k: int) -> float:
        return self.sent[k][0]

    def arrived_at(self, k: int) -> float:
        """When the client held every byte of write k (AssertionError when it never did)."""
        end = self.sent[k][1]
        for at, got in self.reads:
            if got >= end:
                return at
        raise AssertionError(f"write {k} (through byte {end}) never reached the client")

    def ttft_bounds(self, k: int) -> tuple[float, float]:
        """(lo, hi) seconds for a TTFT taken at write k: at least from the upstream's receipt of the request
        to its sending write k, at most from the client's start to its receipt of write k."""
        return (self.sent_at(k) - self.upstream_start - CLOCK_SLACK,
                self.arrived_at(k) - self.client_start + CLOCK_SLACK)

    def gap_bounds(self, i: int, j: int) -> tuple[float, float]:
        """(lo, hi) seconds for the gateway's gap from write i to write j: the instant it saw each lies in
        [sent_at, arrived_at]."""
        return (self.sent_at(j) - self.arrived_at(i) - CLOCK_SLACK,
                self.arrived_at(j) - self.sent_at(i) + CLOCK_SLACK)


def timed_through(gw: GatewayProcess, up: ScriptedUpstream, row: str, path: str, body: dict,
                  headers: dict | None = None):
    """`through`, reading the body read by read on the client side and timing each read (http.client:
    chunked framing removed, content encoding kept, so the bytes are the upstream's).

    Returns (status, response headers, raw body bytes or None when the stream was cut, Timing)."""
    conn = http.client.HTTPConnection("127.0.0.1", gw.port, timeout=30)
    reads: list[tuple[float, int]] = []
    try:
        start = time.monotonic()
        conn.request("POST", path, json.dumps(body).encode(),
                     {"Content-Type": "application/json", "X-Tenant-ID": row, "X-Script": row, **(headers or {})})
        resp = conn.getresponse()
        parts: list[bytes] = []
        got = 0
        raw: bytes | None
        try:
            while part := resp.read1(65536):
                got += len(part)
                reads.append((time.monotonic(), got))
                parts.append(part)
            raw = b"".join(parts)
        except (http.client.IncompleteRead, ConnectionError):
            raw = None
        return resp.status, resp.headers, raw, Timing(up.request(row), start, reads)
    finally:
        conn.close()
