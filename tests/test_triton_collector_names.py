"""Model names and error texts from Triton are untrusted: the collector against a Triton answering with hostile
ones (a local server speaking Triton's HTTP API, as the real one cannot be made to). Every log line stays one
line with Triton's text escaped; an empty model name is left out and counted, never exported as `model=""`;
a call that fails and recovers is logged by model, not by the first word of an error text."""

from __future__ import annotations

import logging

import pytest
from aiohttp import web

from gateway_support import LoopThread
from inferwatch.exporters.triton.collector import TritonCollector
from inferwatch.exporters.triton.reader import TargetConfig

FORGED = 'a"b\nc{x="1"}'  # the name: a quote, a line break and what looks like a label set
# (name, why): names a model repository directory may have (any byte but "/" and NUL) that a log must escape
NAMES = [(FORGED, "newline"), ("d\r\ne", "crlf"), ("f\u2028g", "unicode line separator"),
         ("h\x1b[31mred", "terminal escape"), ("i\\nj", "a backslash and n, not a newline")]
CONFIG = {"max_batch_size": 0, "instance_group": [{"kind": "KIND_CPU", "count": 1}]}


class HostileTriton:
    """Triton's HTTP API for the models of NAMES, "ok" and one with an empty name. `stats_mode`: "bad" (each
    hostile model's statistics malformed), "not_json" (the whole answer), or "good"."""

    def __init__(self):
        self.stats_mode = "bad"
        self.names = [n for n, _ in NAMES] + ["ok", ""]
        self._lt = LoopThread()
        self._runner = self._lt.run(self._start())
        self.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}"

    async def _start(self):
        async def ok(_request):
            return web.Response()

        async def index(_request):
            return web.json_response([{"name": n, "version": "1", "state": "READY"} for n in self.names])

        async def stats(_request):
            if self.stats_mode == "not_json":
                return web.Response(text="<html>\nproxy error\n</html>", content_type="application/json")
            bad = self.stats_mode == "bad"
            return web.json_response({"model_stats": [
                {"name": n, "version": "1", "inference_count": -1 if bad and n not in ("ok", "") else 3}
                for n in self.names]})

        async def config(request):
            name = request.match_info["name"]
            if name == "d\r\ne":  # FORGED cannot be routed here ("{" in a path segment): its answer is 404
                return web.json_response({"error": "load failed\nWARNING forged line"}, status=500)
            return web.json_response(dict(CONFIG, name=name))

        app = web.Application()
        app.add_routes([web.get("/v2/health/live", ok), web.get("/v2/health/ready", ok),
                        web.post("/v2/repository/index", index), web.get("/v2/models/stats", stats),
                        web.get("/v2/models/{name}/config", config), web.get("/metrics", ok)])
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        return runner

    def stop(self):
        self._lt.run(self._runner.cleanup())
        self._lt.close()


@pytest.fixture
def hostile():
    triton = HostileTriton()
    yield triton
    triton.stop()


def _samples(collector):
    return [s for family in collector.collect() for s in family.samples]


def test_hostile_names_are_escaped_in_logs_and_an_empty_name_is_never_exported(hostile, caplog):
    caplog.set_level(logging.INFO, logger="inferwatch.exporters.triton")
    collector = TritonCollector([TargetConfig("t", hostile.url, hostile.url + "/metrics")], timeout=10,
                                config_max_age=0)
    try:
        collector.poll_once(timeout=60)
        collector.poll_once(timeout=60)
        hostile.stats_mode = "not_json"
        collector.poll_once(timeout=60)
        hostile.stats_mode = "good"
        collector.poll_once(timeout=60)
        samples = _samples(collector)
        errors = collector.poll_errors()
    finally:
        collector.close()
    lines = [r.getMessage() for r in caplog.records]
    for line in lines:
        assert line.isprintable(), f"a log line with an unescaped character: {line!r}"
    # The name: logged escaped, once when its statistics start failing and once when they recover.
    escaped = repr(FORGED)
    assert sum(f"stats call for model {escaped} failed (bad_response)" in line for line in lines) == 1
    assert sum(f"stats call for model {escaped} recovered from bad_response" in line for line in lines) == 1
    crlf = repr("d\r\ne")
    assert any(f"config call for model {crlf} failed (http_error)" in line  # Triton's text: whitespace folded
               and "load failed WARNING forged line" in line for line in lines)
    # A whole answer that is not JSON recovers as the call, not "for ValueError".
    assert sum(line.endswith("stats call recovered from bad_response") for line in lines) == 1
    assert not any("for ValueError" in line or "for JSONDecodeError" in line for line in lines)
    for name, why in NAMES:
        assert any(f"for model {name!r}" in line for line in lines), why
    # The empty name: never a series, counted each poll as a bad index entry, logged once.
    models = {s.labels["model"] for s in samples if "model" in s.labels}
    assert "" not in models and {"ok", FORGED} <= models  # label values carry any name (the exposition escapes)
    assert errors[("t", "index", "bad_response")] == 4
    assert sum("empty model name" in line for line in lines) == 1
    # Statistics exported once good, for every named model; none for the empty one.
    counts = {s.labels["model"]: s.value for s in samples if s.name == "inferwatch_triton_model_inferences_total"}
    assert set(counts) == {n for n, _ in NAMES} | {"ok"} and set(counts.values()) == {3}
