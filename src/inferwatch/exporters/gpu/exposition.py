"""/metrics bodies rendered once per collection and served as bytes, negotiated by prometheus-client.

The format and compression a scrape gets are prometheus-client's own choice (`choose_encoder` for the
Accept header: OpenMetrics 1.0 for Prometheus's default Accept, the 0.0.4 text format otherwise;
`gzip_accepted` for Accept-Encoding), and the bytes come from its own generators. What this adds is the
cache dcgm-exporter also keeps: a body is rendered once per published collection and format, not once per
scrape (the gzip variant compresses that same text).

After each collection `prerender` renders the formats scraped so far, in the collector's thread, and swaps
them in when done; until then scrapes get the previous collection's bytes, so a steady scraper never waits
for a render. While it renders, the collector thread steps aside between metric families whenever a scrape
is being served (`Scrapes`), so on a busy machine the render does not stretch scrape latency: the render is
background work, the scrape is what Prometheus times. A format asked for the first time is rendered by
that scrape; a `name[]` filter is rendered per request, uncached.
"""

from __future__ import annotations

import gzip
import threading
import time
from typing import Any, Callable, Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder, gzip_accepted

Encoder = Callable[[Any], bytes]
Key = tuple[str, bool]   # (content type, gzipped)


class Scrapes:
    """Counts scrapes being served, so background rendering can step aside for them.

    `pause()` waits while one is in flight, at most `max_wait_s` per call and `budget_s` per `reset()`, so
    an endless stream of scrapes delays a render by a bounded amount and never starves it.
    """

    def __init__(self, max_wait_s: float = 0.01, budget_s: float = 0.25):
        self._cond = threading.Condition()
        self._in_flight = 0
        self.max_wait_s, self.budget_s = max_wait_s, budget_s
        self._left = budget_s

    def begin(self) -> None:
        with self._cond:
            self._in_flight += 1

    def end(self) -> None:
        with self._cond:
            self._in_flight -= 1
            if not self._in_flight:
                self._cond.notify_all()

    def reset(self) -> None:
        self._left = self.budget_s

    @property
    def budget_left_s(self) -> float:
        return self._left

    def pause(self) -> None:
        with self._cond:
            if not self._in_flight or self._left <= 0:
                return
            started = time.monotonic()
            self._cond.wait_for(lambda: not self._in_flight, timeout=min(self.max_wait_s, self._left))
            self._left -= time.monotonic() - started


class YieldingView:
    """A registry view whose collect() lets in-flight scrapes go first between families (same output)."""

    def __init__(self, registry: CollectorRegistry, scrapes: Scrapes):
        self._registry, self._scrapes = registry, scrapes

    def collect(self) -> Iterator[Any]:
        for family in self._registry.collect():
            self._scrapes.pause()
            yield family


class ExpositionCache:
    """Cached exposition of `registry`. `version()` changes whenever the registry's content does (the GPU
    collector's `version`). Once `prerender` runs after each publish, a scrape gets the newest body rendered
    (at most one render behind); without it, a scrape of a new version renders it.

    Thread-safe. `renders` counts texts rendered (tests and benchmarks read it).
    """

    def __init__(self, registry: CollectorRegistry, version: Callable[[], int], scrapes: Scrapes | None = None):
        self._registry = registry
        self._version = version
        self.scrapes = scrapes or Scrapes()
        self._lock = threading.Lock()
        self._bodies: dict[Key, tuple[int, bytes]] = {}   # key -> (version rendered, bytes served)
        self._wanted: dict[Key, Encoder] = {}
        self._pushed = False   # prerender has run: it refreshes every format after each publish from now on
        self.renders = 0

    def body(self, accept: str | None, accept_encoding: str | None) -> tuple[str, bool, bytes]:
        """(Content-Type, gzipped?, body) for a scrape with these Accept and Accept-Encoding headers."""
        encoder, content_type = choose_encoder(accept or "")
        key = (content_type, gzip_accepted(accept_encoding or ""))
        version = self._version()
        with self._lock:
            self._wanted.setdefault(key, encoder)
            cached = self._bodies.get(key)
            # Once prerender runs after every publish, the newest body is at most one render behind.
            if cached is not None and (cached[0] == version or self._pushed):
                return content_type, key[1], cached[1]
            # First scrape of this format (or no prerender hooked up and a new version): render here, once.
            body = self._encode(encoder, key[1], self._registry)
            self._bodies[key] = (version, body)
            return content_type, key[1], body

    def restricted(self, names: list[str], accept: str | None, accept_encoding: str | None) -> tuple[str, bool, bytes]:
        """Like `body` for `?name[]=...`: only those families, rendered now (a rare, diagnostic request)."""
        encoder, content_type = choose_encoder(accept or "")
        compress = gzip_accepted(accept_encoding or "")
        return content_type, compress, self._encode(encoder, compress, self._registry.restricted_registry(names))

    def prerender(self) -> None:
        """Render every format scraped so far for the current version and swap them in (after each publish)."""
        version = self._version()
        with self._lock:
            wanted = dict(self._wanted)
        self.scrapes.reset()
        view = YieldingView(self._registry, self.scrapes)
        texts: dict[str, bytes] = {}
        bodies: dict[Key, bytes] = {}
        for (content_type, compress), encoder in wanted.items():
            if content_type not in texts:   # one render per format; the gzip variant compresses that text
                texts[content_type] = self._encode(encoder, False, view)
            bodies[(content_type, compress)] = gzip.compress(texts[content_type]) if compress else texts[content_type]
        with self._lock:
            for key, body in bodies.items():
                if self._bodies.get(key, (-1, b""))[0] <= version:
                    self._bodies[key] = (version, body)
            self._pushed = True

    def _encode(self, encoder: Encoder, compress: bool, registry: Any) -> bytes:
        self.renders += 1
        output = encoder(registry)
        return gzip.compress(output) if compress else output
