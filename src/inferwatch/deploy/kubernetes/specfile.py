"""The spec the pods read in the cluster: the user's spec with in-cluster addresses, written back to YAML
for the `inferwatch-spec` ConfigMap, and the Secret keys its secret references need.

Secrets never reach the ConfigMap: `${VAR}` references stay references (the pod gets VAR from a Secret
key of that name), `<field>_file: /path` references stay files (the Secret key named after the file is
mounted there), and an inline value becomes a `${INFERWATCH_<FIELD_PATH>}` reference, so the value must be
put into the Secret instead.
"""

from __future__ import annotations

import dataclasses
import posixpath
import re
import typing
from typing import Any

from inferwatch.deploy.kubernetes.tenancy import pod_trusted_proxies
from inferwatch.spec import Spec, TritonTarget
from inferwatch.specload import Duration, Secret

SPEC_DIR = "/etc/inferwatch"
SPEC_PATH = f"{SPEC_DIR}/inferwatch.yaml"
OUTBOX_DIR = "/var/lib/inferwatch/outbox"
NOTIFIER_PORT = 9410
WORKDIR = "/var/lib/inferwatch"  # the Dockerfile's WORKDIR: where a relative secret file path points


def service_url(spec: Spec, service: str, port: int) -> str:
    return f"http://{service}.{spec.prometheus.kubernetes_namespace}.svc:{port}"


def notifier_url(spec: Spec) -> str:
    return service_url(spec, "inferwatch-notifier", NOTIFIER_PORT)


def triton_url(spec: Spec) -> str:
    t = spec.kubernetes.triton
    return f"http://{t.service}.{t.namespace}.svc:{t.http_port}"


def cluster_spec(spec: Spec) -> Spec:
    """`spec` as the pods see it: Triton, Prometheus, Alertmanager and the notifier at their in-cluster
    addresses, the outbox on its volume, inline secrets turned into references. Thresholds, routes and
    grouping are untouched."""
    k = spec.kubernetes
    ns = spec.prometheus.kubernetes_namespace
    interval = spec.targets.triton[0].metrics_interval_ms if spec.targets.triton else 2000
    # The collector polls every pod behind a headless Service when one is named (replicas.py); the gateway
    # keeps forwarding to the load-balanced Service.
    collector_url = (f"http://{k.triton.pods_service}.{k.triton.namespace}.svc:{k.triton.http_port}"
                     if k.triton.pods_service else triton_url(spec))
    triton = TritonTarget(name=k.triton.service, url=collector_url, node=k.triton.service,
                          headers=dict(k.triton.headers), metrics_interval_ms=interval)
    targets = dataclasses.replace(
        spec.targets, triton=[triton],
        prometheus=k.prometheus_url or f"http://prometheus-operated.{ns}.svc:9090",
        alertmanager=k.alertmanager_url or f"http://alertmanager-operated.{ns}.svc:9093",
        notifier=notifier_url(spec), gpu_exporters=[], triton_collectors=[], gateways=[],
        notifiers=[])  # the ServiceMonitor scrapes every notifier pod; replicas never address each other
    notifier = dataclasses.replace(spec.notifier, data_dir=OUTBOX_DIR)
    # The gateway's peer is the ingress controller's pod, never loopback (inferwatch.deploy.kubernetes.tenancy).
    gateway = dataclasses.replace(spec.gateway, tenant_trusted_proxies=pod_trusted_proxies(spec))
    return with_references(dataclasses.replace(spec, targets=targets, notifier=notifier, gateway=gateway))


def _env_name(path: str) -> str:
    return "INFERWATCH_" + re.sub(r"[^A-Za-z0-9]+", "_", path).strip("_").upper()


def with_references(value: Any) -> Any:
    """A copy of `value` in which every inline Secret is an environment reference."""
    if isinstance(value, Secret):
        return Secret(env=_env_name(value.path), path=value.path) if value.literal is not None else value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.replace(value, **{f.name: with_references(getattr(value, f.name))
                                             for f in dataclasses.fields(value) if f.init})
    if isinstance(value, list):
        return [with_references(v) for v in value]
    if isinstance(value, dict):
        return {k: with_references(v) for k, v in value.items()}
    return value


@dataclasses.dataclass(frozen=True)
class SecretRefs:
    """What one pod needs from its Secret: environment variables (name = key) and files (path → key)."""

    env: tuple[str, ...] = ()
    files: tuple[tuple[str, str], ...] = ()

    @property
    def keys(self) -> list[str]:
        return sorted({*self.env, *(key for _, key in self.files)})


def secrets_in(value: Any) -> list[Secret]:
    """Every Secret in a spec object (dataclass, list, dict), in field order."""
    if isinstance(value, Secret):
        return [value]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return [s for f in dataclasses.fields(value) for s in secrets_in(getattr(value, f.name))]
    if isinstance(value, (list, tuple)):
        return [s for v in value for s in secrets_in(v)]
    if isinstance(value, dict):
        return [s for v in value.values() for s in secrets_in(v)]
    return []


def secret_refs(*parts: Any) -> SecretRefs:
    """The Secret keys the secrets in `parts` (pieces of a cluster_spec) need: environment variables by name,
    files by their name (characters a Secret key cannot hold become '-'; a repeated name gets a suffix).
    A relative file path is taken from the image's working directory, as the process would read it."""
    env: set[str] = set()
    files: dict[str, str] = {}
    for secret in secrets_in(list(parts)):
        if secret.env is not None:
            env.add(secret.env)
        elif secret.file is not None:
            path = posixpath.normpath(posixpath.join(WORKDIR, secret.file))
            if path in files:
                continue
            key = re.sub(r"[^-._a-zA-Z0-9]", "-", posixpath.basename(path)) or "secret"
            base, n = key, 1
            while key in files.values():
                n += 1
                key = f"{base}-{n}"
            files[path] = key
    return SecretRefs(tuple(sorted(env)), tuple(sorted(files.items())))


# ------------------------------------------------------------------------------------ spec -> YAML data
def to_data(value: Any) -> Any:
    """Plain YAML data that `load_spec` reads back into an equal object (fields left at None are left out).
    Raises ValueError for an inline secret: run `cluster_spec` first."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        hints = typing.get_type_hints(type(value))
        out: dict[str, Any] = {}
        for f in dataclasses.fields(value):
            v = getattr(value, f.name)
            if not f.init or v is None:
                continue
            key = f.metadata.get("key", f.name)
            if isinstance(v, Secret):
                _put_secret(out, key, v)
            elif hints[f.name] is Duration or isinstance(v, Duration):
                out[key] = str(v)
            else:
                out[key] = to_data(v)
        return out
    if isinstance(value, Duration):
        return str(value)
    if isinstance(value, list):
        return [to_data(v) for v in value]
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            if isinstance(v, Secret):
                _put_secret(out, k, v)
            else:
                out[k] = to_data(v)
        return out
    return value


def _put_secret(out: dict, key: str, secret: Secret) -> None:
    if secret.file is not None:
        out[f"{key}_file"] = secret.file
    elif secret.env is not None:
        out[key] = f"${{{secret.env}}}"
    else:
        raise ValueError(f"{secret.path}: an inline secret cannot be written to a ConfigMap")
