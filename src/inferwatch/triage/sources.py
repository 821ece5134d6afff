"""Where triage reads from: Prometheus (evidence queries, via prometheus-api-client) and Alertmanager
(firing alerts, `GET /api/v2/alerts`).

Both raise SourceUnreachable with a one-line reason when the server cannot be reached at all; a single
query that fails (bad expression, timeout) is reported as that query's error and never stops the others.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re

import requests
from prometheus_api_client import PrometheusApiClientException, PrometheusConnect
from urllib3.util.retry import Retry

__all__ = ["SourceUnreachable", "QueryResult", "PrometheusSource", "fetch_firing_alerts"]


class SourceUnreachable(RuntimeError):
    """Prometheus or Alertmanager did not answer (connection refused, timeout, not an API)."""


@dataclasses.dataclass
class QueryResult:
    """One evidence value. `value` is the largest sample of the result vector (None: no data or error);
    `series` holds up to 5 (labels, value) pairs, largest first, so the reader sees which series it was."""

    name: str
    expr: str
    value: float | None = None
    series: list[tuple[dict, float]] = dataclasses.field(default_factory=list)
    series_count: int = 0
    error: str | None = None


class PrometheusSource:
    """Instant queries against one Prometheus. `timeout` bounds each HTTP call (seconds); `at` is the
    evaluation time (unix seconds; None = now). Connection failures are retried `retries` times."""

    def __init__(self, url: str, *, timeout: float = 10.0, retries: int = 1, at: float | None = None):
        self.url = url.rstrip("/")
        self.at = at
        # The client's default retries three times with a 1 s back-off on connection errors; triage (and the
        # notifier hook with its short deadline) must fail fast and say so instead.
        retry = Retry(total=retries, connect=retries, read=0, backoff_factor=0.1, status_forcelist=[502, 503, 504])
        self.client = PrometheusConnect(self.url, disable_ssl=True, retry=retry, timeout=timeout)
        self.timeout = timeout

    def check(self) -> None:
        """Raise SourceUnreachable unless Prometheus answers its ready endpoint (or the API root)."""
        try:
            resp = self.client._session.get(f"{self.url}/api/v1/status/buildinfo", timeout=self.timeout)
        except requests.RequestException as exc:
            raise SourceUnreachable(f"cannot reach Prometheus at {self.url}: {_reason(exc)}") from None
        if resp.status_code != 200:
            raise SourceUnreachable(f"Prometheus at {self.url} answered HTTP {resp.status_code} "
                                    "to /api/v1/status/buildinfo (is this a Prometheus API URL?)")

    def query(self, name: str, expr: str) -> QueryResult:
        result = QueryResult(name, expr)
        params = {"time": f"{self.at:.3f}"} if self.at is not None else None
        try:
            data = self.client.custom_query(expr, params=params)
        except PrometheusApiClientException as exc:
            result.error = _api_error(str(exc))
            return result
        except requests.RequestException as exc:
            result.error = f"Prometheus unreachable: {_reason(exc)}"
            return result
        samples: list[tuple[dict, float]] = []
        if data and not isinstance(data[0], dict):  # a scalar result is [ts, "v"], not a vector
            data = [{"metric": {}, "value": data}]
        for item in data or []:
            value = float(item["value"][1])
            if not math.isnan(value):
                samples.append((item.get("metric", {}), value))
        samples.sort(key=lambda s: s[1], reverse=True)
        result.series_count = len(samples)
        result.series = samples[:5]
        result.value = samples[0][1] if samples else None
        return result

    def vector(self, expr: str) -> list[tuple[dict, float]] | None:
        """Every series of the instant vector `expr` at the evaluation time, (labels, value), NaN dropped
        (`query` keeps only the largest five); None when the query fails."""
        params = {"time": f"{self.at:.3f}"} if self.at is not None else None
        try:
            data = self.client.custom_query(expr, params=params)
        except (PrometheusApiClientException, requests.RequestException):
            return None
        if data and not isinstance(data[0], dict):
            return None
        out = []
        for item in data or []:
            value = float(item["value"][1])
            if not math.isnan(value):
                out.append((item.get("metric", {}), value))
        return out

    def raw_samples(self, expr: str) -> list[tuple[dict, list[tuple[float, float]]]] | None:
        """The stored samples of a range selector `expr` (e.g. `up{job="x"}[1h]`) at the evaluation time:
        (labels, [(unix seconds, value), oldest first]) per series; None when the query fails."""
        params = {"time": f"{self.at:.3f}"} if self.at is not None else None
        try:
            data = self.client.custom_query(expr, params=params)
        except (PrometheusApiClientException, requests.RequestException):
            return None
        out = []
        for item in data or []:
            if not isinstance(item, dict) or not isinstance(item.get("values"), list):
                return None   # not a matrix: `expr` was no range selector
            out.append((item.get("metric", {}), [(float(t), float(v)) for t, v in item["values"]]))
        return out

    def label_values(self, expr: str, label: str) -> list[str] | None:
        """Every value of `label` over the series `expr` returns at the evaluation time (a histogram's `le`
        edges); None when the query fails (the caller then shows the value without them)."""
        params = {"time": f"{self.at:.3f}"} if self.at is not None else None
        try:
            data = self.client.custom_query(expr, params=params)
        except (PrometheusApiClientException, requests.RequestException):
            return None
        if not data or not isinstance(data[0], dict):
            return []
        return sorted({item.get("metric", {}).get(label, "") for item in data} - {""})


def fetch_firing_alerts(url: str, timeout: float = 10.0) -> list[dict]:
    """Active alerts from Alertmanager that are neither silenced nor inhibited (API v2 objects, with
    `labels`, `annotations`, `startsAt`). Raises SourceUnreachable."""
    url = url.rstrip("/")
    try:
        resp = requests.get(f"{url}/api/v2/alerts", params={"active": "true", "silenced": "false",
                                                            "inhibited": "false"}, timeout=timeout)
    except requests.RequestException as exc:
        raise SourceUnreachable(f"cannot reach Alertmanager at {url}: {_reason(exc)}") from None
    if resp.status_code != 200:
        raise SourceUnreachable(f"Alertmanager at {url} answered HTTP {resp.status_code} to /api/v2/alerts")
    try:
        alerts = resp.json()
    except ValueError:
        raise SourceUnreachable(f"Alertmanager at {url} did not answer JSON on /api/v2/alerts") from None
    return [a for a in alerts if isinstance(a, dict) and isinstance(a.get("labels"), dict)]


def _reason(exc: Exception) -> str:
    text = str(exc)
    for marker in ("Connection refused", "timed out", "Name or service not known", "No route to host"):
        if marker in text:
            return marker.lower()
    return type(exc).__name__


def _api_error(text: str) -> str:
    # The client wraps the body as HTTP Status Code 400 (b'{"status":"error",...,"error":"..."}').
    m = re.search(r"\(b'(.*)'\)$", text, re.S)
    if m:
        try:
            return json.loads(m.group(1).encode().decode("unicode_escape")).get("error", text)
        except ValueError:
            pass
    return text
