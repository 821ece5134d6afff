"""No credential of a Triton target URL in any output of the Triton collector.

Targets may carry credentials in their URL (`http://user:pass@triton:8000`, or a token as user-info), from
`--triton-url`, `--metrics-url` or the spec's `targets.triton[].url`. The real collector runs verbose (`-v`)
against the real Triton (credentials in its URL), a Triton stand-in that checks the Basic credential and
quotes the request's URL and Authorization header in its error answers, and two unreachable targets; then
stderr, stdout and /metrics are searched for every credential (user-info, password, token, Basic
credential), and the `triton` label values are checked to be host:port. A malformed --triton-url with
credentials is refused without showing them, and the Prometheus scrape configuration written from a spec
whose metrics_url holds credentials targets host:port.
"""

from __future__ import annotations

import base64
import contextlib
import subprocess
import sys
import time

import requests
import yaml
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from inferwatch.exporters.triton.scrape import scrape_configs
from inferwatch.httpserver import BoundedServer
from inferwatch.spec import load_spec
from inferwatch.testing.process import free_port

TRITON_USERINFO = "tw-user7:TritonPass-7f3a9e"
STANDIN_USERINFO = "sx-user4:StandinPass-1c6d2b"
METRICS_USERINFO = "mx-user8:MetricsPass-9c1d4a"
TOKEN = "TOKEN-5e2b8a91c4d7"                       # a token as user-info: http://TOKEN@host
SPEC_USERINFO = "spec-user3:SpecPass-3b7e0f"
BAD_USERINFO = "bad-user2:BadPass-4d2c8a"


def _pieces(userinfo: str) -> list[str]:
    user, _, password = userinfo.partition(":")
    return [userinfo, user, password, base64.b64encode(userinfo.encode()).decode()]


SECRETS = [*_pieces(TRITON_USERINFO), *_pieces(STANDIN_USERINFO), *_pieces(METRICS_USERINFO), TOKEN,
           *_pieces(SPEC_USERINFO), *_pieces(BAD_USERINFO)]


class QuotingTriton:
    """A Triton stand-in on loopback: health answers 200 with the right Basic credential (401 without);
    every other API call fails quoting the URL it was called with, its Authorization header, the bare
    credential and the password, as an authenticating proxy in front of Triton might. /metrics (Triton's own)
    answers the same way. Records what it was sent."""

    def __init__(self, userinfo: str):
        self.expected = "Basic " + base64.b64encode(userinfo.encode()).decode()
        self.password = userinfo.partition(":")[2]
        self.seen: list[tuple[str, str]] = []
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self.handle)
        self.server = BoundedServer(app, "127.0.0.1", 0, name="quoting-triton")

    @property
    def port(self) -> int:
        return self.server.port

    async def handle(self, request: web.Request) -> web.Response:
        auth = request.headers.get("Authorization", "")
        self.seen.append((request.path, auth))
        if request.path.startswith("/v2/health/") and auth == self.expected:
            return web.Response(text="")
        return web.json_response({"error": f"refused {request.url} with Authorization: {auth}; credential "
                                           f"{auth.split()[-1] if auth else '-'} for password {self.password} "
                                           "not valid here"}, status=401)

    def __enter__(self) -> "QuotingTriton":
        self.server.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.stop()


def _triton_labels(text: str) -> set[str]:
    return {s.labels["triton"] for f in text_string_to_metric_families(text) for s in f.samples
            if s.name == "inferwatch_triton_up"}


def test_a_verbose_collector_shows_no_target_credential_anywhere(triton, tmp_path):
    dead, dead_spec, port = free_port(), free_port(), free_port()
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump({"targets": {"triton": [
        {"name": "spec-dead", "url": f"http://{SPEC_USERINFO}@127.0.0.1:{dead_spec}"}]}}))
    with QuotingTriton(STANDIN_USERINFO) as standin:
        argv = [sys.executable, "-m", "inferwatch.cli", "-v", "exporter", "triton", "--spec", str(spec),
                "--triton-url", f"http://{TRITON_USERINFO}@127.0.0.1:{triton.http_port}",
                "--triton-url", f"http://{STANDIN_USERINFO}@127.0.0.1:{standin.port}",
                "--triton-url", f"http://{TOKEN}@127.0.0.1:{dead}",
                "--metrics-url", triton.metrics_url,
                "--metrics-url", f"http://{METRICS_USERINFO}@127.0.0.1:{standin.port}/metrics",
                "--port", str(port), "--interval", "500ms"]
        stdout_path, stderr_path = tmp_path / "stdout", tmp_path / "stderr"
        outputs: dict[str, str] = {}
        with open(stdout_path, "wb") as out, open(stderr_path, "wb") as err:
            proc = subprocess.Popen(argv, stdout=out, stderr=err)
        try:
            deadline = time.monotonic() + 60
            while True:   # every target polled, and the failing calls polled more than once
                with contextlib.suppress(requests.RequestException):
                    text = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=2).text
                    if len(_triton_labels(text)) == 4 and sum(p == "/v2/models/stats" for p, _ in standin.seen) >= 2:
                        break
                assert proc.poll() is None and time.monotonic() < deadline, stderr_path.read_text()[-3000:]
                time.sleep(0.2)
            outputs["/metrics"] = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
        finally:
            proc.terminate()
            proc.wait(20)
        outputs["stderr"], outputs["stdout"] = stderr_path.read_text(), stdout_path.read_text()
    bad = subprocess.run([sys.executable, "-m", "inferwatch.cli", "exporter", "triton", "--no-spec-targets",
                          "--triton-url", f"http://{BAD_USERINFO}@127.0.0.1:99999"], capture_output=True, text=True,
                         timeout=60)
    assert bad.returncode == 2 and "--triton-url" in bad.stderr
    outputs["refused --triton-url"] = bad.stdout + bad.stderr

    # The credentials were used: the stand-in saw the Basic credential of its URL and of its metrics URL.
    assert ("/v2/health/live", standin.expected) in standin.seen
    assert ("/metrics", "Basic " + base64.b64encode(METRICS_USERINFO.encode()).decode()) in standin.seen
    # Labels name targets by host:port (or the spec's name), never by their user-info.
    assert _triton_labels(outputs["/metrics"]) == {f"127.0.0.1:{triton.http_port}", f"127.0.0.1:{standin.port}",
                                                   f"127.0.0.1:{dead}", "spec-dead"}
    assert f'inferwatch_triton_up{{triton="127.0.0.1:{triton.http_port}"}} 1.0' in outputs["/metrics"]
    # The log said what happened, with the targets it was about and the URLs redacted.
    log = outputs["stderr"]
    assert f"triton 127.0.0.1:{dead} (http://<redacted>@127.0.0.1:{dead}) unreachable" in log, log[-3000:]
    assert f"triton spec-dead (http://<redacted>@127.0.0.1:{dead_spec}) unreachable" in log
    assert "refused http://127.0.0.1" in log and "Authorization: Basic <redacted>" in log  # quoted error bodies
    lines = sum(len(v.splitlines()) for v in outputs.values())
    leaks = {(where, s) for where, text in outputs.items() for s in SECRETS if s in text}
    print(f"\nsearched {lines} lines of output (stderr -v, stdout, /metrics, a refused --triton-url) for "
          f"{len(SECRETS)} credential pieces of 6 target URLs: {len(leaks)} found")
    assert not leaks, leaks


def test_scrape_config_targets_host_port_never_user_info(tmp_path):
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump({"targets": {"triton": [
        {"name": "t0", "url": f"http://{SPEC_USERINFO}@triton-0:8000",
         "metrics_url": f"http://{METRICS_USERINFO}@triton-0:8002/metrics"},
        {"name": "t1", "url": f"http://{SPEC_USERINFO}@[fd00::1]:8000",
         "metrics_url": f"https://{TOKEN}@[fd00::1]:9443/metrics"}]}}))
    configs = scrape_configs(load_spec(str(spec)))
    text = yaml.safe_dump(configs)
    assert [c["targets"] for c in configs[0]["static_configs"]] == [["triton-0:8002"], ["[fd00::1]:9443"]]
    assert not [s for s in SECRETS if s in text]
