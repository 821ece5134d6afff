"""Realistic traffic for the example models: batched `classifier` requests and streamed `toy_llm` requests.

Used by the demo, the tests and the benchmarks. Each generator runs in a thread at a steady rate until
stopped, and counts what it sent and what failed, so callers can compare with what the metrics say.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import requests


@dataclasses.dataclass
class TrafficStats:
    sent: int = 0
    ok: int = 0
    failed: int = 0
    tokens: int = 0
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock, repr=False)

    def add(self, ok: bool, tokens: int = 0) -> None:
        with self.lock:
            self.sent += 1
            self.ok += ok
            self.failed += not ok
            self.tokens += tokens


def classifier_body(batch: int = 1, fail: float = 0.0) -> dict:
    body: dict[str, Any] = {"inputs": [{"name": "INPUT", "shape": [batch, 16], "datatype": "FP32",
                        "data": [random.random() for _ in range(batch * 16)]}]}
    if fail:
        body["parameters"] = {"fail": fail}
    return body


def infer_classifier(base_url: str, batch: int = 1, fail: float = 0.0, version: str | None = None,
                     headers: dict | None = None, timeout: float = 10.0) -> bool:
    """One classifier inference over Triton's HTTP/REST API; True when it succeeded."""
    path = f"/v2/models/classifier/versions/{version}/infer" if version else "/v2/models/classifier/infer"
    try:
        resp = requests.post(base_url + path, json=classifier_body(batch, fail), headers=headers, timeout=timeout)
        return resp.status_code == 200
    except requests.RequestException:
        return False


def stream_toy_llm(base_url: str, *, max_tokens: int = 16, first_token_delay_ms: int = 20,
                   token_delay_ms: int = 5, fail: float = 0.0, headers: dict | None = None,
                   timeout: float = 30.0) -> tuple[bool, int]:
    """One streamed generation via generate_stream; returns (ok, tokens received)."""
    body = {"text_input": "hello", "max_tokens": max_tokens, "first_token_delay_ms": first_token_delay_ms,
            "token_delay_ms": token_delay_ms}
    if fail:
        body["fail"] = fail
    tokens = 0
    try:
        with requests.post(base_url + "/v2/models/toy_llm/generate_stream", json=body, headers=headers,
                           stream=True, timeout=timeout) as resp:
            if resp.status_code != 200:
                return False, 0
            for line in resp.iter_lines():
                if not line.startswith(b"data:"):
                    continue
                event = json.loads(line[5:])
                if "error" in event:
                    return False, tokens
                tokens += 1
    except (requests.RequestException, ValueError):
        return False, tokens
    return True, tokens


class TrafficLoop:
    """Call `fn()` at `rate_per_s` from a small pool until stop(); fn returns (ok, tokens)."""

    def __init__(self, name: str, fn, rate_per_s: float, workers: int = 8):
        self.name = name
        self.fn = fn
        self.rate = rate_per_s
        self.stats = TrafficStats()
        self._stop = threading.Event()
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=f"traffic-{name}")
        self._thread = threading.Thread(target=self._run, name=f"traffic-{name}", daemon=True)

    def start(self) -> "TrafficLoop":
        self._thread.start()
        return self

    def _one(self) -> None:
        result = self.fn()
        ok, tokens = result if isinstance(result, tuple) else (bool(result), 0)
        self.stats.add(ok, tokens)

    def _run(self) -> None:
        interval = 1.0 / self.rate
        next_at = time.monotonic()
        for _ in itertools.count():
            if self._stop.is_set():
                return
            self._pool.submit(self._one)
            next_at += interval
            delay = next_at - time.monotonic()
            if delay > 0 and self._stop.wait(delay):
                return

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._pool.shutdown(wait=True, cancel_futures=True)
