"""No secret in any output. The real notifier runs verbose (`-v`: urllib3's and aiohttp's debug lines
included) with known secrets in every place a spec can hold one, against channel endpoints that fail and
quote their own URL and key in their error bodies; then every output is searched for every secret: stderr,
`outbox list --all`, /metrics, and the answers to refused requests. Plus the redaction filter itself:
installed on every handler, applied to exception text, and to URL pieces as libraries print them.
"""

from __future__ import annotations

import base64
import logging
import os
import subprocess
import sys
import threading
from urllib.parse import quote, quote_plus

import pytest
import requests
import yaml
from aiohttp import web

from inferwatch import redaction
from inferwatch.testing.process import free_port
from notifier_support import notifier_process, wait_for, webhook

SLACK_TOKEN = "sLaCkT0kenQ9x8c7v6b5n4m3"          # a Slack hook's last path segment (24 chars)
WECOM_KEY = "5f0c2d7e-1a9b-4c3d-8e7f-6a5b4c3d2e1f"
ROUTING_KEY = "R0utingKeyQ1w2e3r4t5y6u7i8o9p0aS"
VOICE_TOKEN = "voice-bearer-zX81vB72nM63"
VOICE_PASSWORD = "v0icePassw0rd-Kq9"             # user-info in the voice URL
BEARER = "notifier-bearer-Lk4Jh5Gf6Ds7"
SECRETS = [SLACK_TOKEN, WECOM_KEY, ROUTING_KEY, VOICE_TOKEN, VOICE_PASSWORD, BEARER,
           base64.b64encode(f"caller:{VOICE_PASSWORD}".encode()).decode()]


def quoted_forms(secret: str) -> dict[str, str]:
    """The forms a provider's error text may quote a secret in (each must be redacted)."""
    raw = secret.encode()
    return {"exact": secret, "lowercased": secret.lower(), "uppercased": secret.upper(),
            "base64": base64.b64encode(raw).decode(), "base64 unpadded": base64.b64encode(raw).decode().rstrip("="),
            "base64url": base64.urlsafe_b64encode(raw).decode(), "percent-encoded": quote(secret, safe=""),
            "percent-encoded, lowercase hex": quote(secret, safe="").lower(), "form-encoded": quote_plus(secret)}


class QuotingProviders:
    """Channel endpoints that fail the way providers do, quoting what they were sent: the URL with its key,
    the routing key in a validation error, the Authorization header. Runs its own loop in a thread."""

    def __init__(self):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.voice_url = f"http://caller:{VOICE_PASSWORD}@127.0.0.1:{self.port}/voice/call"
        self._loop = None
        self._runner = None

    async def slack(self, request):  # 500: retried, so logged again and again
        return web.Response(status=500, text=f"upstream failure posting to {request.url}")

    async def wecom(self, request):  # WeCom answers HTTP 200 with an errcode, quoting the key
        return web.json_response({"errcode": 93000, "errmsg": f"invalid webhook url, hint: [{request.url}] "
                                                              f"key={request.query.get('key')}"})

    async def pagerduty(self, request):
        body = await request.json()
        key = body.get("routing_key")
        # Quoted as given, and in every other form a provider's error may use (lowercased, base64, ...).
        return web.json_response({"status": "invalid event", "message": "Event object is invalid",
                                  "errors": [f"routing_key {key} is not valid", f'"routing_key": "{key}"',
                                             *(f"integration {form} unknown" for form in quoted_forms(key).values())]},
                                 status=400)

    async def voice(self, request):
        return web.Response(status=401, text=f"rejected {self.voice_url} with "
                                             f"{request.headers.get('Authorization')}")

    def __enter__(self):
        import asyncio

        started = threading.Event()

        def run():
            self._loop = asyncio.new_event_loop()
            app = web.Application()
            app.add_routes([web.post(f"/services/T01/B02/{SLACK_TOKEN}", self.slack),
                            web.post("/cgi-bin/webhook/send", self.wecom), web.post("/v2/enqueue", self.pagerduty),
                            web.post("/voice/call", self.voice)])
            self._runner = web.AppRunner(app, access_log=None)
            self._loop.run_until_complete(self._runner.setup())
            self._loop.run_until_complete(web.TCPSite(self._runner, "127.0.0.1", self.port).start())
            started.set()
            self._loop.run_forever()

        threading.Thread(target=run, daemon=True).start()
        started.wait(10)
        return self

    def __exit__(self, *exc):
        import asyncio

        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)


def test_a_verbose_notifier_failing_against_quoting_providers_shows_no_secret_anywhere(tmp_path):
    with QuotingProviders() as providers:
        (tmp_path / "routing-key").write_text(ROUTING_KEY + "\n")
        (tmp_path / "wecom-url").write_text(f"{providers.url}/cgi-bin/webhook/send?key={WECOM_KEY}\n")
        spec = {
            "channels": {
                "phone": {"type": "pagerduty", "routing_key_file": str(tmp_path / "routing-key"),
                          "url": f"{providers.url}/v2/enqueue"},
                "call": {"type": "voice", "url": providers.voice_url,
                         "headers": {"Authorization": f"Bearer {VOICE_TOKEN}"}},
                "oncall-slack": {"type": "slack", "url": "${T_SLACK_URL}"},
                "llm-wecom": {"type": "wecom", "url_file": str(tmp_path / "wecom-url")},
            },
            "routes": [{"match": {"layer": "L1"}, "receivers": ["phone", "call"]},
                       {"match": {"layer": "L2"}, "receivers": ["oncall-slack"]},
                       {"match": {"layer": "L3"}, "receivers": ["llm-wecom"]}],
            "notifier": {"bearer_token": "${T_NOTIFIER_TOKEN}", "retry_initial": "200ms", "retry_max": "400ms"},
        }
        spec_file = tmp_path / "spec.yaml"
        spec_file.write_text(yaml.safe_dump(spec))
        env = {**os.environ, "T_NOTIFIER_TOKEN": BEARER,
               "T_SLACK_URL": f"{providers.url}/services/T01/B02/{SLACK_TOKEN}"}
        cli = [sys.executable, "-m", "inferwatch.cli"]
        stderr_path, stdout_path = tmp_path / "stderr", tmp_path / "stdout"
        outputs: dict[str, str] = {}
        with notifier_process(spec_file, tmp_path / "data", stderr_path, verbose=True, env=env,
                              stdout_path=stdout_path) as (_, url):
            auth = {"Authorization": f"Bearer {BEARER}"}
            for name, layer in (("SecretL1", "L1"), ("SecretL2", "L2"), ("SecretL3", "L3")):
                assert requests.post(url + "/alerts", json=webhook(name, layer), headers=auth, timeout=10).ok
            refused = requests.post(url + "/alerts", json=webhook(), timeout=10,
                                    headers={"Authorization": f"Bearer {BEARER}x"})
            outputs["401 answer"] = refused.text + str(refused.headers)

            def failures_seen():
                text = stderr_path.read_text()
                return ("bad_key" in text or "dead-lettered" in text) and text.count("will be retried") >= 2
            wait_for(failures_seen, timeout=30, what="dead letters and retries in the log")
            outputs["/metrics"] = requests.get(url + "/metrics", timeout=10).text
            lst = subprocess.run([*cli, "notifier", "outbox", "list", "--all", "--spec", str(spec_file),
                                  "--data-dir", str(tmp_path / "data")], env=env, capture_output=True, text=True,
                                 timeout=60)
            outputs["outbox list"] = lst.stdout + lst.stderr
            assert "invalid webhook url" in outputs["outbox list"] or "HTTP 5" in outputs["outbox list"]
        outputs["stderr"] = stderr_path.read_text()
        outputs["stdout"] = stdout_path.read_text()
    assert "urllib3.connectionpool" in outputs["stderr"]  # the verbose third-party lines are there...
    assert "<redacted>" in outputs["stderr"]             # ...and were redacted
    lines = sum(len(v.splitlines()) for v in outputs.values())
    leaks = {(where, s, form) for where, text in outputs.items() for s in SECRETS
             for form, quoted in quoted_forms(s).items() if quoted in text}
    print(f"\nsearched {lines} lines of output (stderr -v, outbox list, /metrics, refused answer) for "
          f"{len(SECRETS)} secrets: {len(leaks)} found")
    assert not leaks, leaks


# ------------------------------------------------------------------------------------ the filter itself
def test_url_secret_parts_are_redacted_as_libraries_print_them():
    redaction.register(f"https://hooks.example.com/services/T9/B9/{SLACK_TOKEN}X")
    redaction.register(f"https://qyapi.example.com/cgi-bin/webhook/send?key={WECOM_KEY}X&debug=1")
    redaction.register(f"https://user:{VOICE_PASSWORD}X@voice.example.com/call")
    text = redaction.redact(f'"POST /services/T9/B9/{SLACK_TOKEN}X HTTP/1.1" 500 and '
                            f'"POST /cgi-bin/webhook/send?key={WECOM_KEY}X&debug=1 HTTP/1.1" and '
                            f"{VOICE_PASSWORD}X alone")
    assert SLACK_TOKEN not in text and WECOM_KEY not in text and VOICE_PASSWORD not in text
    assert "/services/T9/B9/<redacted>" in text and "debug=1" in text  # only the secret parts go


SECRET_WITH_SYMBOLS = "R0ut1ngK3y>>?~~"  # its base64 has "+", its base64url "-": both forms differ


@pytest.mark.parametrize("form", list(quoted_forms(SECRET_WITH_SYMBOLS)))
@pytest.mark.parametrize("registered", [True, False], ids=["registered", "given to redact()"])
def test_a_secret_is_redacted_in_every_case_and_encoding_a_provider_may_quote(form, registered):
    quoted = quoted_forms(SECRET_WITH_SYMBOLS)[form]
    text = f"provider says: integration {quoted} is unknown"
    if registered:
        redaction.register(SECRET_WITH_SYMBOLS)
        out = redaction.redact(text)
    else:
        out = redaction.redact(text.replace(quoted, quoted_forms("UnRegistered-K3y~~")[form]),
                               ["UnRegistered-K3y~~"])
    assert out == "provider says: integration <redacted> is unknown", (form, out)


@pytest.mark.parametrize("text, secret", [
    ("https://qyapi.weixin.qq.com/cgi-bin/webhook/send?key=abc123def456", "abc123def456"),
    ("https://oapi.dingtalk.com/robot/send?access_token=tok987654321", "tok987654321"),
    ("https://hooks.slack.com/services/T000/B000/XXXXXXXXXXXXXXXXXXXXXXXX", "XXXXXXXXXXXXXXXXXXXXXXXX"),
    ("POST /services/T000/B000/YYYYYYYYYYYYYYYYYYYYYYYY HTTP/1.1", "YYYYYYYYYYYYYYYYYYYYYYYY"),
    ("http://admin:hunter2hunter2@triton:8000/v2", "hunter2hunter2"),
    ("https://ghp_tokentokentoken@git.example.com/x", "ghp_tokentokentoken"),
    ("headers: {'Authorization': 'Bearer abc.def.ghi'}", "abc.def.ghi"),
    ('{"routing_key": "R0ut1ngK3yUnregistered", "event_action": "trigger"}', "R0ut1ngK3yUnregistered"),
])
def test_credential_patterns_are_redacted_even_when_never_registered(text, secret):
    assert secret not in redaction.redact(text)


def test_the_filter_is_on_every_handler_and_redacts_messages_args_and_tracebacks(capsys):
    from inferwatch.cli import setup_logging

    root = logging.getLogger()
    saved = root.handlers[:]
    root.handlers = []  # setup_logging as on a fresh process (pytest installs its own handlers)
    third_party = logging.getLogger("some.library")
    own = logging.StreamHandler(sys.stderr)
    third_party.addHandler(own)
    try:
        setup_logging(verbose=True)
        assert all(redaction.FILTER in h.filters for h in redaction.all_handlers())
        redaction.register("sup3r-secret-value")
        logging.getLogger("urllib3.connectionpool").debug('"POST /x?key=%s HTTP/1.1" 200', "sup3r-secret-value")
        try:
            raise ValueError("failed to reach https://h/send?token=sup3r-secret-value")
        except ValueError:
            third_party.exception("call failed for %s", "sup3r-secret-value")
        err = capsys.readouterr().err
        assert "sup3r-secret-value" not in err
        assert err.count("<redacted>") >= 4 and "ValueError" in err
    finally:
        third_party.removeHandler(own)
        for h in root.handlers:
            root.removeHandler(h)
        root.handlers = saved
