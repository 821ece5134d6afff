"""RequestMeter: the definitions of every per-request gateway metric, fed with events.

One request's life is `start` (construction) → `tokens(n)` per token-bearing event → `finish(outcome, code)`.
The proxy and the in-process API both drive this class; nothing else computes a gateway metric.

Definitions (docs/sources.md#llm-user-experience-metrics):
- TTFT: arrival → first token-bearing event; streamed requests only (a non-streamed TTFT would equal the
  whole latency, a fault seen in LiteLLM and others).
- Sequences: a request with several choices (`n` > 1, parallel sampling) has one sequence per choice, as
  vLLM counts them; TTFT is the first token of any sequence, tokens add up over all of them, and every gap
  below is between two events of the same sequence (interleaved choices are not one faster sequence).
- Time per output chunk: gap between consecutive token-bearing events of one sequence, once per event after
  the sequence's first (OpenTelemetry `gen_ai.client.operation.time_per_output_chunk`).
- ITL: the same gap divided by the tokens of the later event, observed once per token, so a chunk with
  several tokens does not inflate it (as SGLang and vLLM do); only for events whose token count is known
  (`exact`: a running count, token logprobs, Triton's count field). Where a chunk's count is unknown (a
  final `usage` only says the total), the chunk time is the honest figure and no ITL is recorded.
- TPOT: (last token − first token) / (tokens − 1), once per successful streamed request with ≥ 2 tokens
  (vLLM `request_time_per_output_token_seconds`, OpenTelemetry `gen_ai.server.time_per_output_token`); with
  several sequences, once per sequence with ≥ 2 events, over the tokens counted from its events.
- Output tokens per second: output tokens / request duration (AIPerf "E2E output token throughput").
- Token types (docs/cost-and-budgets.md): cached prompt tokens (OpenAI `prompt_tokens_details.cached_tokens`,
  Responses `input_tokens_details.cached_tokens`, Anthropic `cache_read_input_tokens`), prompt tokens written to
  a cache (Anthropic `cache_creation_input_tokens`) and reasoning tokens (`completion_tokens_details` /
  `output_tokens_details.reasoning_tokens`): each a part of the input or output count, exact from the usage
  object and None (absent) when the server does not say; never estimated.
- Tokens metered: the upstream's exact count when it reports one (OpenAI `usage`, a cumulative count field),
  else the tokens counted from events; every outcome is metered, cancelled and failed streams included,
  so billing and per-request metrics agree (in vLLM they do not for aborted streams).
"""

from __future__ import annotations

import bisect
import dataclasses
import time

from inferwatch.exporters.gateway.metrics import ITL_BUCKETS, Series, code_label, observe_counts

# ITL observations are gathered per request and written in bulk (one write per bucket used) when the request
# ends, and at least this often while a long stream runs, so /metrics lags a running stream by at most this.
ITL_FLUSH_S = 1.0
# Usage's token-type fields, in the order of metrics.DETAIL_TYPES (cached_input, cache_creation_input, reasoning).
DETAIL_FIELDS = ("cached_input_tokens", "cache_creation_input_tokens", "reasoning_tokens")
# Choice indexes kept apart as sequences; a higher index (no server samples that many) joins sequence 0, so a
# stream cannot grow the meter's state beyond this.
MAX_SEQUENCES = 128


@dataclasses.dataclass(frozen=True)
class Usage:
    """What one finished request consumed: its record for billing (see docs/gateway.md#token-counts-for-billing).

    `input_tokens` / `output_tokens` are None when the upstream revealed no count (unknown, never 0);
    `code` is the HTTP status the client got; `error_code` / `error_type` are what the upstream's error object
    said (e.g. 500 / "InternalServerError" sent mid-stream under 200), or error_type "truncated" for a stream
    that ended without its end marker; `unmetered` names why the answer's counts are unknown (encoding,
    too_large, invalid_count, meter_error: metrics.UNMETERED_REASONS), else None.
    `cached_input_tokens` / `cache_creation_input_tokens` (parts of `input_tokens`) and `reasoning_tokens` (part
    of `output_tokens`) are None when the server did not report them; `cost` is the request's price in the
    spec's `billing.currency` (inferwatch/billing.py), None when a count it needs is unknown or nothing is priced.
    """

    tenant: str
    model: str
    tier: str
    outcome: str
    code: int
    input_tokens: int | None
    output_tokens: int | None
    method: str | None
    duration_seconds: float
    error_code: int | str | None = None
    error_type: str | None = None
    unmetered: str | None = None
    cached_input_tokens: int | None = None
    cache_creation_input_tokens: int | None = None
    reasoning_tokens: int | None = None
    cost: float | None = None

    def __post_init__(self):
        # A record is written as JSON: a count that is not one (counts.py) must never reach the usage log.
        for name in ("input_tokens", "output_tokens") + DETAIL_FIELDS:
            value = getattr(self, name)
            if value is not None and (type(value) is not int or value < 0):
                raise ValueError(f"Usage.{name} must be a non-negative int or None, not {value!r}")


class RequestMeter:
    """Measures one request. `clock` is monotonic seconds (time.perf_counter by default).

    `streamed` decides whether TTFT/ITL/TPOT apply. `exact_output_tokens` (set from the upstream's own count)
    replaces the counted total when the request finishes. Calling `finish` twice records once.
    ITL observations reach the histogram in bulk: when the request finishes, and at least every ITL_FLUSH_S
    seconds while it streams (so a running stream's ITL shows on /metrics at most that late).
    """

    __slots__ = ("series", "streamed", "clock", "started", "first_token_at", "last_token_at", "counted_tokens",
                 "exact_output_tokens", "input_tokens", "method", "upstream_started", "upstream_duration",
                 "finished", "unmetered", "error_code", "error_type", "_itl", "_itl_sum", "_itl_written",
                 "_chunks", "_chunk_sum", "_first0", "_seqs", "details", "api")

    def __init__(self, series: Series, streamed: bool, clock=time.perf_counter, started: float | None = None):
        self.series = series
        self.streamed = streamed
        self.clock = clock
        self.started = clock() if started is None else started
        self.first_token_at: float | None = None
        self.last_token_at = 0.0
        self.counted_tokens = 0
        self.exact_output_tokens: int | None = None
        self.input_tokens: int | None = None  # None: the upstream did not say (unknown is not zero)
        self.method: str | None = None
        self.upstream_started: float | None = None
        self.upstream_duration: float | None = None
        self.finished = False
        self.unmetered: str | None = None
        self.error_code: int | str | None = None
        self.error_type: str | None = None
        self._itl: list[int] | None = None  # ITL observations not yet written, per bucket (+Inf last)
        self._itl_sum = 0.0
        self._itl_written = self.started
        self._chunks: list[int] | None = None  # chunk-time observations not yet written, as _itl
        self._chunk_sum = 0.0
        self._first0: float | None = None  # sequence 0's first token (last_token_at is its last)
        self._seqs: dict[int, list] | None = None  # sequence ≥ 1 → [first token at, last token at, tokens]
        # Token types (DETAIL_FIELDS order) as the upstream's usage reported them; None: not reported.
        self.details: list[int | None] | None = None  # allocated only when a server reports one
        # The API the request used (otlp.APIS key: its gen_ai.operation.name); None: Triton's gRPC API.
        self.api: str | None = None
        series.in_flight.inc()

    def tokens(self, n: int, now: float | None = None, seq: int = 0, exact: bool = True) -> None:
        """A token-bearing event of sequence (choice) `seq` carrying `n` ≥ 1 tokens arrived at `now`;
        `exact`: `n` is the event's known token count (else an estimate, and no ITL is observed for it)."""
        if n <= 0:
            return
        now = self.clock() if now is None else now
        if self.first_token_at is None:
            self.first_token_at = now
            if self.streamed:
                self.series.ttft.observe(now - self.started)
        if seq and 0 < seq < MAX_SEQUENCES:  # a second choice and beyond (n > 1)
            seqs = self._seqs
            if seqs is None:
                seqs = self._seqs = {}
            state = seqs.get(seq)
            if state is None:
                seqs[seq] = [now, now, n]
            else:
                if self.streamed:
                    self._gap(now - state[1], n, exact, now)
                state[1] = now
                state[2] += n
        else:
            if self._first0 is None:
                self._first0 = now
            elif self.streamed:
                # _gap inlined: this branch runs once per event of every single-choice stream.
                gap = now - self.last_token_at
                chunks = self._chunks
                if chunks is None:
                    chunks = self._chunks = [0] * (len(ITL_BUCKETS) + 1)
                i = bisect.bisect_left(ITL_BUCKETS, gap)
                chunks[i] += 1
                self._chunk_sum += gap
                if exact:
                    counts = self._itl
                    if counts is None:
                        counts = self._itl = [0] * (len(ITL_BUCKETS) + 1)
                    counts[i if n == 1 else bisect.bisect_left(ITL_BUCKETS, gap / n)] += n
                    self._itl_sum += gap
                if now - self._itl_written >= ITL_FLUSH_S:
                    self._write_itl(now)
            self.last_token_at = now
        self.counted_tokens += n
        if self.method is None:
            self.method = "events"

    def _gap(self, gap: float, n: int, exact: bool, now: float) -> None:
        """An event `gap` seconds after its sequence's previous one, carrying `n` tokens."""
        chunks = self._chunks
        if chunks is None:
            chunks = self._chunks = [0] * (len(ITL_BUCKETS) + 1)
        chunks[bisect.bisect_left(ITL_BUCKETS, gap)] += 1
        self._chunk_sum += gap
        if exact:
            per_token = gap / n
            counts = self._itl
            if counts is None:
                counts = self._itl = [0] * (len(ITL_BUCKETS) + 1)
            counts[bisect.bisect_left(ITL_BUCKETS, per_token)] += n
            self._itl_sum += gap
        if now - self._itl_written >= ITL_FLUSH_S:
            self._write_itl(now)

    def _write_itl(self, now: float) -> None:
        if self._itl is not None:
            observe_counts(self.series.itl, self._itl, self._itl_sum)
            self._itl = None
            self._itl_sum = 0.0
        if self._chunks is not None:
            observe_counts(self.series.chunk_time, self._chunks, self._chunk_sum)
            self._chunks = None
            self._chunk_sum = 0.0
        self._itl_written = now

    def set_exact_output_tokens(self, total: int, method: str) -> None:
        """The upstream's own count of all output tokens so far (cumulative); `method`: usage|count_field.
        `total` is a count already checked (counts.token_count). Ignored once the request is unmetered."""
        if self.unmetered is not None:
            return
        self.exact_output_tokens = total
        self.method = method

    def set_detail(self, index: int, count: int | None) -> None:
        """Token type `index` (DETAIL_FIELDS) as the upstream's usage reports it (None: not reported, which
        keeps an earlier report). `count` is already checked (counts.token_count)."""
        if count is None or self.unmetered is not None:
            return
        details = self.details
        if details is None:
            details = self.details = [None, None, None]
        details[index] = count

    def upstream_begin(self, now: float | None = None) -> None:
        self.upstream_started = self.clock() if now is None else now

    def upstream_end(self, now: float | None = None) -> None:
        if self.upstream_started is not None and self.upstream_duration is None:
            self.upstream_duration = (self.clock() if now is None else now) - self.upstream_started

    def stop_metering(self, reason: str) -> None:
        """The answer's counts cannot be known (`reason`: one of metrics.UNMETERED_REASONS): they become
        unknown (None), and nothing is added to gateway_tokens_total for this request."""
        self.unmetered = reason
        self.method = "none"

    @property
    def output_tokens(self) -> int | None:
        """The upstream's exact count, else the count from events; None when unknown (unmetered, or a
        non-streamed answer that revealed no count)."""
        if self.unmetered is not None:
            return None
        if self.exact_output_tokens is not None:
            return self.exact_output_tokens
        return self.counted_tokens if self.method == "events" or self.streamed else None

    def finish(self, outcome: str, code: int, now: float | None = None,
               label_code: int | str | None = None) -> Usage | None:
        """Record the request's end. `outcome`: ok|error|cancelled|timeout; `code`: HTTP status sent. The metric's
        code label is `label_code` when given (an upstream error object's code sent under 200), else `code`;
        either is bounded to the known codes (metrics.code_label)."""
        if self.finished:
            return None
        self.finished = True
        if self.method is None and self.streamed and self.unmetered is None:
            # A stream that carried no token event (it failed or ended first) was still counted from its
            # events: 0 tokens, by method "events", so the record never shows a count without its method.
            self.method = "events"
        now = self.clock() if now is None else now
        s = self.series
        self._write_itl(now)
        s.in_flight.dec()
        duration = now - self.started
        s.duration.observe(duration)
        if self.upstream_started is not None:
            self.upstream_end(now)
            if self.upstream_duration is not None:  # set by upstream_end
                s.upstream_duration.observe(self.upstream_duration)
        s.count_request(code if label_code is None else label_code, outcome)
        out = self.output_tokens
        inputs = None if self.unmetered is not None else self.input_tokens
        if out:
            s.add_tokens("output", out)
        if inputs:
            s.add_tokens("input", inputs)
        details = self.details if self.unmetered is None else None
        if details is not None:
            s.add_details(details)
        cost = s.add_cost(inputs, out, details)
        if self.method is not None:
            s.count_method(self.method)
        tpots: tuple[float, ...] = ()
        if outcome == "ok" and out:
            s.output_tokens.observe(out)
            if duration > 0:
                s.tokens_per_second.observe(out / duration)
            if self.streamed and self._seqs is None:
                if out >= 2 and self._first0 is not None:
                    tpots = ((self.last_token_at - self._first0) / (out - 1),)
            elif self.streamed:
                tpots = self._sequence_tpots()
            for value in tpots:
                s.tpot.observe(value)
        otlp = s.metrics.otlp
        if otlp is not None:  # the same values as the Prometheus families above (exporters/gateway/otlp.py)
            ttft = self.first_token_at - self.started if self.streamed and self.first_token_at is not None else None
            otlp.record(s.key, self.api, outcome, code_label(code if label_code is None else label_code), duration,
                        ttft, inputs, out, tpots)
        return self.usage(outcome, code, duration, cost)

    def _sequence_tpots(self) -> tuple[float, ...]:
        """TPOT once per sequence of a several-choice request, over the tokens counted from its events (the
        upstream's exact count is the request's total, not a sequence's)."""
        sequences = list(self._seqs.values()) if self._seqs else []
        if self._first0 is not None:
            sequences.append([self._first0, self.last_token_at, self.counted_tokens - sum(q[2] for q in sequences)])
        return tuple((last - first) / (count - 1) for first, last, count in sequences if count >= 2)

    def usage(self, outcome: str, code: int, duration: float, cost: float | None = None) -> Usage:
        """The request's billing record as the meter knows it now (finish's; also the record of a request
        whose metering failed, once stop_metering has made its counts unknown)."""
        tenant, model, tier = self.series.key
        inputs = None if self.unmetered is not None else self.input_tokens
        details = self.details if self.unmetered is None and self.details is not None else (None, None, None)
        return Usage(tenant, model, tier, outcome, code, inputs, self.output_tokens, self.method, duration,
                     self.error_code, self.error_type, self.unmetered, details[0], details[1], details[2], cost)
