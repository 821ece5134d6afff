"""/metrics bodies rendered once per collection and served as bytes, negotiated by prometheus-client.

The format and compression a scrape gets are prometheus-client's own choice (`choose_encoder` for the
Accept header: OpenMetrics 1.0 for Prometheus's default Accept, the 0.0.4 text format otherwise;
`gzip_accepted` for Accept-Encoding), and the bytes come from its own generators. What this adds is the
cache dcgm-exporter also keeps: a body is rendered once per published collection and format variant, not
once per scrape. The variants scraped so far are rendered again right after each collection
(`prerender`, in the collector's thread), so a steady scraper never waits for rendering; a variant asked
for the first time is rendered by that scrape. A `name[]` filter is rendered per request, uncached.
"""

from __future__ import annotations

import gzip
import threading
from typing import Callable

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder, gzip_accepted

Encoder = Callable[[CollectorRegistry], bytes]


class ExpositionCache:
    """Cached exposition of `registry`. `version()` changes whenever the registry's content does (the GPU
    collector's `version`); bodies of an older version are never served once a newer one is known.

    Thread-safe. `renders` counts texts rendered (tests and benchmarks read it); the gzip variant of a
    format is compressed from that format's text, not rendered again.
    """

    def __init__(self, registry: CollectorRegistry, version: Callable[[], int]):
        self._registry = registry
        self._version = version
        self._lock = threading.Lock()
        self._cached_version: int | None = None
        self._texts: dict[str, bytes] = {}                # content type -> rendered text
        self._bodies: dict[tuple[str, bool], bytes] = {}  # (content type, gzipped) -> the bytes served
        self._wanted: dict[tuple[str, bool], Encoder] = {}
        self.renders = 0

    def body(self, accept: str | None, accept_encoding: str | None) -> tuple[str, bool, bytes]:
        """(Content-Type, gzipped?, body) for a scrape with these Accept and Accept-Encoding headers."""
        encoder, content_type = choose_encoder(accept or "")
        key = (content_type, gzip_accepted(accept_encoding or ""))
        with self._lock:
            self._wanted.setdefault(key, encoder)
            return content_type, key[1], self._get(key, encoder)

    def restricted(self, names: list[str], accept: str | None, accept_encoding: str | None) -> tuple[str, bool, bytes]:
        """Like `body` for `?name[]=...`: only those families, rendered now (a rare, diagnostic request)."""
        encoder, content_type = choose_encoder(accept or "")
        compress = gzip_accepted(accept_encoding or "")
        self.renders += 1
        output = encoder(self._registry.restricted_registry(names))
        return content_type, compress, gzip.compress(output) if compress else output

    def prerender(self) -> None:
        """Render every variant scraped so far for the current version (call after each publish)."""
        with self._lock:
            for key, encoder in list(self._wanted.items()):
                self._get(key, encoder)

    def _get(self, key: tuple[str, bool], encoder: Encoder) -> bytes:
        # Rendering under the lock: concurrent scrapes of a new version wait for one render, not do N.
        version = self._version()
        if version != self._cached_version:
            self._texts.clear()
            self._bodies.clear()
            self._cached_version = version
        body = self._bodies.get(key)
        if body is None:
            content_type, compress = key
            text = self._texts.get(content_type)
            if text is None:   # one render per format; the gzip variant compresses the same text
                self.renders += 1
                text = self._texts[content_type] = encoder(self._registry)
            body = self._bodies[key] = gzip.compress(text) if compress else text
        return body
