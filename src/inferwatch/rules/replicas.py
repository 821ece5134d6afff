"""The Triton collector's series of one replica under the identity Triton's own series give that replica.

The collector cannot know pod names. Polling a headless Service's name it labels each replica's series
`address="IP:PORT"` (the pod's IP and Triton's HTTP port, `[IP]:PORT` for IPv6; exporters/triton/replicas.py);
polling a name with one address it adds no label. Triton's own scrape names the same pod by its target labels:
`pod`, `node`, `instance="IP:8002"` (the metrics port) on `up`, which exists for every discovered target,
answering or not (`up` 0 while the pod hangs still carries its service-discovery labels).

`joined(expr)` gives each collector series the spec's replica and node labels (`identity.triton`) of the Triton
target behind it, matched on the server label and a key:

- a series with `address`: the IP of `address` against the IP of Triton's `instance` (ports differ: 8000 and
  8002). A pod IP reused by a new pod names the newest: of several `up` series for one IP the one with the
  latest sample (`topk` by `timestamp(up)`), so an old pod's series still inside the lookback after its target
  went away never doubles a match;
- a series without it (one address): the server's only replica, where Triton's scrape has exactly one for that
  server (a headless Service with one pod behind it gives no `address`); none where it has several (a
  load-balanced name: no replica can be named) or none.

The collector's own labels are kept (`address` too: one per replica and constant for a pod's life); the match
adds the replica label and replaces `node` (the collector's node is its target's, not the pod's).
`unmatched(expr)` is the rest, unchanged: no Triton series for that address (no Triton scrape, or not yet
discovered) or several replicas and no address. `view(expr)` is both, each collector series once.
"""

from __future__ import annotations

from inferwatch.rules.identity import TritonLabels, by

# A temporary label holding the IP both sides are matched on; removed before any alert sees it.
KEY = "replica_ip"
# `IP:PORT` or `[IPv6]:PORT` -> IP (RE2, anchored by label_replace). A PromQL string: backslashes doubled.
IP_OF = "\\\\[(.+)\\\\]:[0-9]+|([^:]+):[0-9]+"


def _ip(expr: str, label: str) -> str:
    return f'label_replace({expr}, "{KEY}", "$1$2", "{label}", "{IP_OF}")'


def targets(ids: TritonLabels, up: str) -> str:
    """One series per (server, key) naming the replica behind it: labels server, replica, node and KEY (the
    IP of `instance`), plus, without KEY, the only replica of a server with one. `up`: Triton's own `up`
    selector (spec `selectors.triton`)."""
    server, replica, node = ids.server, ids.replica, ids.node
    named = by((server, replica, node))
    by_ip = (f"group by ({named}, {KEY}) (\n  topk by ({server}, {KEY}) (1, {_ip(f'timestamp({up})', 'instance')})\n)")
    only = (f"group by ({named}) (topk by ({server}) (1, timestamp({up})))\n"
            f"and on ({server})\n(count by ({server}) (group by ({server}, {replica}) ({up})) == 1)")
    return f"(\n  {_indent(by_ip)}\n  or\n  {_indent(only)}\n)"


def _keyed(expr: str) -> str:
    return _ip(expr, "address")


def _drop_key(expr: str) -> str:
    return f'label_replace({expr}, "{KEY}", "", "{KEY}", ".*")'


def matched(ids: TritonLabels, up: str, expr: str) -> str:
    """`expr` (collector series, with the spec's server label) that name a Triton target, with that target's
    replica and node labels (module doc)."""
    return _drop_key(f"(\n  {_keyed(expr)}\n  * on ({ids.server}, {KEY}) group_left ({ids.replica}, {ids.node})\n"
                     f"  {_indent(targets(ids, up))}\n)")


def unmatched(ids: TritonLabels, up: str, expr: str) -> str:
    """`expr` without the series `matched` names, unchanged."""
    return _drop_key(f"(\n  {_keyed(expr)}\n  unless on ({ids.server}, {KEY})\n  {_indent(targets(ids, up))}\n)")


def view(ids: TritonLabels, up: str, expr: str) -> str:
    """`expr` with every series that names a Triton target joined to it and the others unchanged."""
    return f"{matched(ids, up, expr)}\nor\n{unmatched(ids, up, expr)}"


def _indent(text: str) -> str:
    return text.replace("\n", "\n  ")
