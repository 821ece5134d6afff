"""The central store watching itself (spec `central_store`, docs/central-store-selfwatch.md): VictoriaMetrics,
the edge vmagent and vmalert, scraped by the store's watcher (a small Prometheus beside the store,
deploy/central/watch-prometheus.yml), which evaluates this group and notifies Alertmanager itself. The rules on
the store cannot report the store: when it stops, vmalert's queries fail and every alert, the heartbeat
included, stops (the dead man's switch then pages, but says nothing about why).

Metric names are the programs' own (VictoriaMetrics, vmagent and vmalert `/metrics`, read from the Debian
`victoria-metrics` binaries): `vm_free_disk_space_bytes{path}`, `vm_data_size_bytes{type}`,
`vm_rows_inserted_total{type}`, `vm_storage_is_read_only`; `vmagent_remotewrite_errors_total{url}`,
`vmagent_remotewrite_pending_data_bytes{path,url}`, `vmagent_remotewrite_packets_dropped_total{url}` (blocks
the store refused with 400/409), `vm_persistentqueue_bytes_dropped_total{path}` (the queue over
`-remoteWrite.maxDiskUsagePerURL`); `vmalert_execution_errors_total`, `vmalert_alerts_send_errors_total{addr}`,
`vmalert_remotewrite_errors_total`.

Every alert is one incident per program instance: identity `job`, `instance` (plus the cluster label for the
edge, a static label of its target). Layer L1 with `component: alerting`, like the other alerts about the
alerting path. The down alerts read `up == 0` only: these groups are also loaded by vmalert on the store
(rules/generated/*.yml), where none of these jobs is scraped, so an absent-target branch would fire there.
"""

from __future__ import annotations

from inferwatch.rules.builders import num
from inferwatch.rules.model import Alert, Group, Recording
from inferwatch.spec import Duration, Spec

LABELS = {"component": "alerting"}
BY = "job, instance"


def _down(name: str, selector, what: str, impact: str, for_: Duration) -> Alert:
    return Alert(name, f"{selector('up')} == 0", for_, "critical",
                 f"The store's watcher cannot scrape {what} at {{{{ $labels.instance }}}} (job "
                 f"{{{{ $labels.job }}}}): {impact}",
                 labels=dict(LABELS))


def groups(spec: Spec) -> list[Group]:
    c = spec.central_store
    window = str(spec.prometheus.rate_window)
    for_ = spec.layers.L1.for_
    # Error counters: failing in every window for the window plus L1's `for`, so one transient error (a
    # retried request) never pages while errors at every retry (vmagent retries at least once a minute) do.
    errors_for = Duration(spec.prometheus.rate_window.ms + for_.ms)
    vm, agent, vmalert = (spec.selectors.of(s) for s in ("victoriametrics", "vmagent", "vmalert"))
    free = f"sum by ({BY}) ({vm('vm_free_disk_space_bytes')})"
    pending = f"sum by ({BY}) ({agent('vmagent_remotewrite_pending_data_bytes')})"
    alerts: list[Recording | Alert] = [
        _down("VictoriaMetricsDown", vm, "the central store (VictoriaMetrics)",
              "no edge can write to it and vmalert cannot evaluate any rule, so no other alert fires.", for_),
        # Read-only: free space fell under -storage.minFreeDiskSpaceBytes and the store refuses every write.
        # No rows at all for a whole window while it answers: nothing reaches it (edges and vmalert refused).
        Alert("VictoriaMetricsNotIngesting",
              f"max by ({BY}) ({vm('vm_storage_is_read_only')}) == 1\n"
              f"or\nsum by ({BY}) (rate({vm('vm_rows_inserted_total')}[{window}])) == 0",
              for_, "critical",
              f"The central store at {{{{ $labels.instance }}}} stores no new samples ({{{{ if eq $value 1.0 }}}}"
              f"read-only: its free disk space is under -storage.minFreeDiskSpaceBytes{{{{ else }}}}no row "
              f"inserted over the last {window}{{{{ end }}}}): every alert evaluated on it reads stale data.",
              labels=dict(LABELS)),
        Alert("VictoriaMetricsDiskSpaceLow",
              f"{free}\n/\n({free} + sum by ({BY}) ({vm('vm_data_size_bytes')}))\n< {num(c.min_free_disk_ratio)}",
              for_, "warning",
              f"The central store at {{{{ $labels.instance }}}} has {{{{ $value | humanizePercentage }}}} of its "
              f"space free (under {num(c.min_free_disk_ratio * 100)}%): background merges slow down, and at "
              f"-storage.minFreeDiskSpaceBytes it turns read-only.",
              labels=dict(LABELS)),
        _down("VmagentDown", agent, "the edge vmagent",
              "its cluster's samples reach the store no more, and every alert of that cluster goes blind.", for_),
        Alert("VmagentRemoteWriteFailing",
              f"sum by ({BY}) (rate({agent('vmagent_remotewrite_errors_total')}[{window}])) > 0",
              errors_for, "critical",
              f"The vmagent at {{{{ $labels.instance }}}} fails to write to the central store "
              f"({{{{ $value | printf \"%.2f\" }}}} errors/s over {window}): samples queue on its disk and the alerts "
              f"of its cluster read stale data.",
              labels={**LABELS, "signal": "errors"}),
        Alert("VmagentRemoteWriteFailing",
              f"{pending} > {c.queue_pending_bytes}\nand\n"
              f"sum by ({BY}) (deriv({agent('vmagent_remotewrite_pending_data_bytes')}[{window}])) > 0",
              for_, "critical",
              f"The vmagent at {{{{ $labels.instance }}}} holds {{{{ $value | humanize1024 }}}}B for the central "
              f"store and the queue grew over the last {window}: the store takes samples slower than they come.",
              labels={**LABELS, "signal": "queue_growing"}),
        # Dropped data never reaches the store: page on the first block.
        Alert("VmagentRemoteWriteFailing",
              f"sum by ({BY}) (increase({agent('vmagent_remotewrite_packets_dropped_total')}[{window}])) > 0\n"
              f"or\nsum by ({BY}) (increase({agent('vm_persistentqueue_bytes_dropped_total')}[{window}])) > 0",
              Duration(0), "critical",
              f"The vmagent at {{{{ $labels.instance }}}} dropped data for the central store in the last "
              f"{window} (blocks the store refused, or its queue over -remoteWrite.maxDiskUsagePerURL): those "
              f"samples are lost.",
              labels={**LABELS, "signal": "dropping"}),
        _down("VmalertDown", vmalert, "vmalert",
              "no rule is evaluated on the store and no alert of any cluster fires.", for_),
        Alert("VmalertFailing",
              f"sum by ({BY}) (rate({vmalert('vmalert_execution_errors_total')}[{window}])) > 0",
              errors_for, "critical",
              f"vmalert at {{{{ $labels.instance }}}} fails {{{{ $value | printf \"%.2f\" }}}} rule evaluations/s over "
              f"{window}: the rules that fail record nothing and their alerts cannot fire.",
              labels={**LABELS, "signal": "evaluation"}),
        Alert("VmalertFailing",
              f"sum by ({BY}) (rate({vmalert('vmalert_alerts_send_errors_total')}[{window}])) > 0",
              errors_for, "critical",
              f"vmalert at {{{{ $labels.instance }}}} fails to send alerts to Alertmanager "
              f"({{{{ $value | printf \"%.2f\" }}}} errors/s over {window}): firing alerts reach nobody.",
              labels={**LABELS, "signal": "notification"}),
        Alert("VmalertFailing",
              f"sum by ({BY}) (rate({vmalert('vmalert_remotewrite_errors_total')}[{window}])) > 0",
              errors_for, "critical",
              f"vmalert at {{{{ $labels.instance }}}} fails to write recorded series back to the store "
              f"({{{{ $value | printf \"%.2f\" }}}} errors/s over {window}): alerts reading recordings go blind, and a "
              f"restart forgets the `for` state.",
              labels={**LABELS, "signal": "remote_write"}),
    ]
    return [Group("inferwatch-centralstore.alerts", alerts)]
