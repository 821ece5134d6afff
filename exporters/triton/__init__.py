"""L2 Triton collector: what Triton's own /metrics cannot tell (model state, batching, config).

Modules: `scrape` (Prometheus scrape_configs for jobs `triton` and `inferwatch-triton`), `snapshot`
(plain data), `reader` (HTTP API → snapshot), `families` (snapshot → metric families), `collector`
(background poll loop, serves the last snapshot), `cli` (`inferwatch exporter triton`).
"""
