"""The spec's trusted-network lists (inferwatch/networks.py): `gateway.tenant_trusted_proxies` and
`kubernetes.tenant_trusted_proxies` refuse a network with host bits set, naming the field, and `inferwatch
check` warns about a network that trusts every peer (anyone could bill any tenant)."""

from __future__ import annotations

import pytest
import yaml

from inferwatch.cli import main
from inferwatch.networks import TRUSTED_LISTS, open_trust_findings
from inferwatch.spec import SpecError, spec_from_dict


def _raw(path: str, values: list) -> dict:
    section, name = path.split(".")
    return {section: {name: values}}


# (entry, refused message fragment or None when accepted). The case: 10.0.0.5/8.
ENTRIES = [
    ("10.0.0.5/8", "'10.0.0.5/8' has host bits set: write '10.0.0.0/8' for the network or '10.0.0.5/32' for "
                   "the one address"),
    ("192.168.1.1/24", "write '192.168.1.0/24' for the network or '192.168.1.1/32'"),
    ("fd00::1/64", "write 'fd00::/64' for the network or 'fd00::1/128'"),
    ("10.0.0.0/33", "expected an IP address or CIDR network, got '10.0.0.0/33'"),
    ("ingress", "expected an IP address or CIDR network, got 'ingress'"),
    ("", "expected an IP address or CIDR network, got ''"),
    (8, "expected an IP address or CIDR network"),
    ("10.0.0.0/8", None),
    ("10.0.0.5", None),
    ("10.0.0.5/32", None),
    ("fd00::/64", None),
    ("::1", None),
]


@pytest.mark.parametrize("path", TRUSTED_LISTS)
@pytest.mark.parametrize("entry, refused", ENTRIES)
def test_an_entry_is_a_network_without_host_bits_or_refused_with_its_path(path, entry, refused):
    raw = _raw(path, ["127.0.0.1/32", entry])
    if refused is None:
        spec_from_dict(raw)
        return
    with pytest.raises(SpecError) as exc:
        spec_from_dict(raw)
    assert exc.value.path == f"{path}[1]"
    assert refused in exc.value.detail


def test_check_refuses_host_bits_with_one_line_and_no_traceback(tmp_path, capsys):
    path = tmp_path / "inferwatch.yaml"
    path.write_text(yaml.safe_dump(_raw("kubernetes.tenant_trusted_proxies", ["10.0.0.5/8"])))
    assert main(["check", "--spec", str(path)]) != 0
    err = capsys.readouterr().err
    assert err.splitlines() == [f"inferwatch: error: {path}: kubernetes.tenant_trusted_proxies[0]: '10.0.0.5/8' "
                                f"has host bits set: write '10.0.0.0/8' for the network or '10.0.0.5/32' for the "
                                f"one address"], err


# (entries, paths warned): warned only where an entry holds every address of its family.
OPEN = [
    (["0.0.0.0/0"], ["[0]"]),
    (["::/0"], ["[0]"]),
    (["::ffff:0:0/96"], ["[0]"]),           # every IPv4 peer of a dual-stack listener
    (["10.0.0.0/8", "0.0.0.0/0", "::/0"], ["[1]", "[2]"]),
    (["0.0.0.0/1", "128.0.0.0/1"], []),    # wide, but each half is named on purpose
    (["10.244.0.0/16"], []),
    ([], []),
]


@pytest.mark.parametrize("path", TRUSTED_LISTS)
@pytest.mark.parametrize("entries, warned", OPEN)
def test_check_warns_about_a_network_that_trusts_everyone(path, entries, warned):
    found = open_trust_findings(spec_from_dict(_raw(path, entries)))
    mine = [f for f in found if f.path.startswith(path)]
    assert [f.path for f in mine] == [f"{path}{i}" for i in warned]
    assert all(not f.refuse and "anyone who reaches the gateway can bill any tenant" in f.message for f in mine)


def test_the_default_spec_trusts_no_open_network():
    assert open_trust_findings(spec_from_dict({})) == []


def test_inferwatch_check_prints_the_open_network_warning_and_accepts_the_spec(tmp_path, capsys):
    path = tmp_path / "inferwatch.yaml"
    path.write_text(yaml.safe_dump(_raw("gateway.tenant_trusted_proxies", ["127.0.0.1/32", "0.0.0.0/0"])))
    assert main(["check", "--spec", str(path)]) == 0
    err = capsys.readouterr().err
    assert "warning: gateway.tenant_trusted_proxies[1]: 0.0.0.0/0 trusts every IPv4 peer to set X-Tenant-ID: " \
           "anyone who reaches the gateway can bill any tenant" in err, err
