"""A central store needs `cluster.name` (docs/several-clusters.md "Steps"): every cluster writing to one store
is told apart by that value alone, so a spec with `central_store.url` and no usable name is refused, naming
`cluster.name`, by the loader and by `inferwatch check` (one line, no traceback)."""

from __future__ import annotations

import pytest
import yaml

from inferwatch.cli import main
from inferwatch.spec import SpecError, spec_from_dict

STORE = {"central_store": {"url": "http://victoria-metrics:8428"}}

# (spec, refused path or None, the cluster name the spec ends with). The case: a central store and
# no cluster.name.
ROWS = [
    ({**STORE}, "cluster.name", None),
    ({**STORE, "cluster": {"name": ""}}, "cluster.name", None),
    ({**STORE, "cluster": {"name": "  "}}, "cluster.name", None),
    ({**STORE, "cluster": {"name": " eu-1"}}, "cluster.name", None),
    ({**STORE, "cluster": {"name": "eu-1\n"}}, "cluster.name", None),
    ({"cluster": {"name": "eu\t1"}}, "cluster.name", None),                     # refused with or without a store
    ({**STORE, "cluster": {"name": "eu-1"}}, None, "eu-1"),
    ({**STORE, "prometheus": {"external_labels": {"cluster": "eu-2"}}}, None, "eu-2"),  # the older spelling
    ({**STORE, "cluster": {"name": "eu-1", "label": "region"}}, None, "eu-1"),
    ({}, None, ""),                                                            # one cluster, no store: no name
]


@pytest.mark.parametrize("raw, refused, name", ROWS)
def test_a_central_store_needs_a_cluster_name_that_tells_clusters_apart(raw, refused, name):
    if refused is None:
        assert spec_from_dict(raw).cluster.name == name
        return
    with pytest.raises(SpecError) as exc:
        spec_from_dict(raw)
    assert exc.value.path == refused


def test_check_refuses_a_central_store_without_a_cluster_name_in_one_line(tmp_path, capsys):
    path = tmp_path / "inferwatch.yaml"
    path.write_text(yaml.safe_dump(STORE))
    assert main(["check", "--spec", str(path)]) != 0
    err = capsys.readouterr().err
    assert err.splitlines() == [f"inferwatch: error: {path}: cluster.name: required with central_store.url: every "
                                f"cluster writing to the store needs its own name, or their series could not be "
                                f"told apart"], err
