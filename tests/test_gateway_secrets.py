"""Credentials in the upstream URL (`http://user:password@host`) authenticate the gateway to the upstream and
never reach a log line (debug logging on), an error text, a metric or the usage log: the test greps all of
the gateway process's output after a run through success, pass-through, 502, 504 and a cut stream."""

from __future__ import annotations

import base64
import subprocess
import sys

import requests

from gateway_support import GatewayProcess, Script, ScriptedUpstream, refused_port, through

USER, PASSWORD = "meter-bot", "S3cr3t-pa55-9f2c"
TOKEN = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
SECRETS = (PASSWORD, TOKEN)
CHAT = "/v1/chat/completions"
SPEC = {"tenants": ["ok", "cut", "slow", "own"], "models": ["gpt-test"], "gateway": {"upstream_timeout": "300ms"}}


def assert_clean(text: str, where: str) -> None:
    for secret in SECRETS:
        assert secret not in text, f"{where} holds a credential"


def test_upstream_credentials_are_used_and_never_shown(tmp_path):
    up = ScriptedUpstream()
    url = up.url.replace("http://", f"http://{USER}:{PASSWORD}@")
    gw = GatewayProcess(url, SPEC, tmp_path)
    answers = []
    try:
        up.scripts["ok"] = Script([b'data: {"choices":[{"index":0,"delta":{"content":"x"},"finish_reason":"stop"}]}'
                                   b"\n\n"])
        up.scripts["cut"] = Script([b'data: {"choices":[{"index":0,"delta":{"content":"x"}}]}\n\n', ("cut",)])
        up.scripts["slow"] = Script([b"data: [DONE]\n\n"], delay=2.0)
        up.scripts["own"] = Script([b"{}"], content_type="application/json")
        for row in ("ok", "cut", "slow"):
            answers.append(through(gw, row, CHAT, {"model": "gpt-test", "stream": True}))
        assert up.received[0]["headers"]["Authorization"] == f"Basic {TOKEN}"  # the credentials are used
        assert answers[2][0] == 504
        # A client's own Authorization is forwarded as sent (the URL's credentials only fill its absence).
        through(gw, "own", CHAT, {"model": "gpt-test"}, {"Authorization": "Bearer client-key"})
        assert up.received[-1]["headers"]["Authorization"] == "Bearer client-key"
        pass_through = requests.get(gw.url + "/v2/health/ready", timeout=10)
        answers.append((pass_through.status_code, pass_through.headers, pass_through.content))
        metrics = requests.get(gw.metrics_url, timeout=10).text
    finally:
        up.stop()
    try:
        down = requests.post(gw.url + CHAT, json={"model": "gpt-test"}, headers={"X-Tenant-ID": "ok"}, timeout=10)
        assert down.status_code == 502
        answers.append((down.status_code, down.headers, down.content))
    finally:
        gw.stop()
    output = gw.output()
    assert "upstream unavailable" in output and "did not answer" in output  # the failures were logged
    assert_clean(output, "the gateway's log")
    assert_clean(gw.usage_path.read_text(), "the usage log")
    assert_clean(metrics, "/metrics")
    for status, headers, body in answers:
        assert_clean(f"{status} {dict(headers)} {body!r}", "an answer")


def test_credentials_in_a_bad_upstream_url_are_not_echoed():
    with refused_port() as port:
        for url in (f"ftp://{USER}:{PASSWORD}@127.0.0.1:{port}", f"http://{USER}:{PASSWORD}@127.0.0.1:99999"):
            run = subprocess.run([sys.executable, "-m", "inferwatch.cli", "exporter", "gateway", "--upstream", url],
                                 capture_output=True, text=True, timeout=60)
            assert run.returncode == 2 and "--upstream" in run.stderr
            assert_clean(run.stdout + run.stderr, "the usage error")
