"""L2 Triton collector: what Triton's own /metrics cannot tell (model state, batching, config, ensemble
steps and decoupled models, exact statistics).

Modules: `scrape` (Prometheus scrape_configs for jobs `triton` and `inferwatch-triton`), `snapshot`
(plain data, index and config parsers), `stats` (the statistics answer with exact integers), `answers`
(size-bounded reads, float-free JSON), `configcache` (which configurations to fetch), `reader` (HTTP API →
snapshot), `families` (snapshot → metric families), `collector` (background poll loop, serves the last
snapshot), `server` (the bounded /metrics HTTP server), `cli` (`inferwatch exporter triton`).
"""
