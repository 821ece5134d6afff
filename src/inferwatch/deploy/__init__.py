"""The generators of `deploy/`: one module per generated folder, run by `inferwatch generate` (its registry,
inferwatch.generate.GENERATORS) and by the commands that check a spec.

- `prometheus.py`: `deploy/prometheus/` (scrape jobs, rule files, Alertmanager peers);
- `alertmanager.py`: `deploy/alertmanager/`, with its checkers `routecheck.py` (matchers that can never
  match), `routetable.py` (the effective routing table) and `webhook_size.py` (alerts per webhook that fit
  the notifier's body limit);
- `compose.py`: `deploy/compose/`; `central.py`: `deploy/central/` (the central store);
- `kubernetes/`: `deploy/kubernetes/` (the kustomize base); `gates/`: `deploy/kubernetes/gates/`.

Runtime components (exporters, notifier, triage) never import this package (tests/test_layers.py).
"""
