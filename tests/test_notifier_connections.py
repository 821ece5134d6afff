"""Connection exhaustion: idle or slow sockets cannot lock Alertmanager out of the intake.

The attack: the real notifier process with 1,024 file descriptors, and 1,100 idle TCP connections held
open (reopened as soon as the notifier closes one). Alertmanager-shaped POSTs, each on a new connection as
Alertmanager's client opens one after an idle close, must still be accepted during the attack; the log gets
one line per condition, not a traceback per accept. Also: the header timeout closes a connection that
never completes its request head, the idle timeout a kept-alive one, and neither cuts a request in progress.
"""

from __future__ import annotations

import socket
import time

import pytest
import requests
import yaml

from connection_attack import FD_LIMIT, IdleAttack, closed_within, fd_limit
from inferwatch.connections import FD_RESERVE, connection_cap
from inferwatch.notifier.service import NotifierService
from inferwatch.testing.channels import ProviderSimulators
from notifier_support import AUTH, make_spec, metric, notifier_process, spec_data, webhook

IDLE_CONNECTIONS = 1100
POSTS = 40


@pytest.fixture(scope="module")
def sims():
    with ProviderSimulators() as s:
        yield s


def test_posts_are_accepted_while_1100_idle_connections_hold_a_1024_fd_notifier(sims, tmp_path):
    sims.set_mode("ok")
    spec_file = tmp_path / "spec.yaml"
    spec_file.write_text(yaml.safe_dump(spec_data(sims)))
    stderr_path = tmp_path / "notifier.stderr"
    with notifier_process(spec_file, tmp_path / "data", stderr_path, preexec_fn=fd_limit) as (proc, url):
        accepted = 0
        codes = []
        host, port = url.rsplit("/", 1)[1].split(":")
        with IdleAttack(host, int(port), IDLE_CONNECTIONS) as attack:
            attack.wait_shedding()  # the notifier is at its cap
            for i in range(POSTS):
                try:
                    r = requests.post(url + "/alerts", json=webhook(f"UnderAttack{i}", "L2", group=f"attack-{i}"),
                                      headers={**AUTH, "Connection": "close"}, timeout=10)
                    codes.append(r.status_code)
                    accepted += r.status_code == 200
                except requests.RequestException as exc:
                    codes.append(type(exc).__name__)
                time.sleep(0.1)
            held = len(attack.socks)
            reopened = attack.reopened
        print(f"\nPOSTs accepted under attack: {accepted}/{POSTS} ({IDLE_CONNECTIONS} idle connections, "
              f"{held} held at the end, {reopened} reopened after the notifier closed them; fd limit {FD_LIMIT}, "
              f"connection cap {connection_cap(512, FD_LIMIT)})")
        assert accepted == POSTS, codes
        assert reopened > 0  # the attack really was over the cap: the notifier closed idle ones
        assert metric(url, 'inferwatch_notifier_http_connections_closed_total{reason="connection_cap"}') > 0
        log = stderr_path.read_text()
        assert "Traceback" not in log and "out of system resource" not in log, log[-3000:]
        cap_lines = [ln for ln in log.splitlines() if "connection cap reached" in ln]
        assert len(cap_lines) <= 2, cap_lines  # once a minute (the attack lasts less than two)
        assert "delivery to" not in log, log[-3000:]  # the notifier's own requests to the channels got through


def test_cap_stays_below_the_fd_limit():
    assert connection_cap(512, 1024) == 512
    assert connection_cap(512, 300) == 300 - FD_RESERVE
    assert connection_cap(10_000, 1 << 20) == 10_000


@pytest.fixture
def service(sims, tmp_path):
    sims.set_mode("ok")
    svc = NotifierService(make_spec(sims, header_timeout="1s", idle_timeout="2s", body_timeout="1s"),
                          tmp_path / "data", port=0).start()
    yield svc
    svc.stop()


def test_header_timeout_closes_a_connection_that_never_completes_its_request_head(service):
    with socket.create_connection((service.host, service.port)) as s:
        s.sendall(b"POST /alerts HTTP/1.1\r\nHost: x\r\n")  # and nothing more: slowloris
        assert closed_within(s, 10) is not None
    text = requests.get(service.url + "/metrics").text
    assert 'inferwatch_notifier_http_connections_closed_total{reason="header_timeout"} 1.0' in text


def test_idle_keep_alive_connection_is_closed_after_the_idle_timeout(service):
    body = b'{"version": "3"}'
    with socket.create_connection((service.host, service.port)) as s:
        s.sendall(b"POST /alerts HTTP/1.1\r\nHost: x\r\nAuthorization: " + AUTH["Authorization"].encode() +
                  b"\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
        s.settimeout(10)
        assert s.recv(4096).startswith(b"HTTP/1.1 400")  # answered; the connection stays open (keep-alive)
        waited = closed_within(s, 10)
    assert waited is not None and waited >= 1.0  # not closed at once, but after the 2s idle timeout


def test_a_slow_body_gets_408_and_is_counted(service):
    with socket.create_connection((service.host, service.port)) as s:
        s.sendall(b"POST /alerts HTTP/1.1\r\nHost: x\r\nAuthorization: " + AUTH["Authorization"].encode() +
                  b"\r\nContent-Length: 100\r\n\r\n{")
        s.settimeout(10)
        answer = s.recv(4096)
    assert answer.startswith(b"HTTP/1.1 408")
    text = requests.get(service.url + "/metrics").text
    assert 'inferwatch_notifier_webhooks_total{outcome="malformed"} 1.0' in text
