"""Generator of deploy/kubernetes/gates/: kustomize Components (kustomize.config.k8s.io/v1alpha1) an overlay
opts into with `components: [...]` (each needs its controller's CRDs or API):

- `gates/`: the Argo Rollouts AnalysisTemplates and the Flagger MetricTemplates, and
  `flagger-canary-analysis.yaml`, the `analysis` block of a Flagger Canary to paste into yours (not a
  resource: a Canary names your own workload);
- `gates/keda/`: the KEDA ScaledObject;
- `gates/hpa/`: the same signals as an `autoscaling/v2` HPA over prometheus-adapter, whose external rules
  are `prometheus-adapter-config.yaml` (not a resource: the adapter's configuration). One scaler or the
  other: KEDA makes its own HPA for the same Deployment.

Registered in `inferwatch generate`, so `--check` fails when a file is stale."""

from __future__ import annotations

from inferwatch.deploy.gates import objects
from inferwatch.rules.generate import HEADER, dump
from inferwatch.spec import Spec

OUT_DIR = "deploy/kubernetes/gates"
ANALYSIS_SNIPPET = "flagger-canary-analysis.yaml"
ADAPTER_CONFIG = "hpa/prometheus-adapter-config.yaml"
WHAT = {"": "Canary gates from the alerts' recording rules (docs/canary-gates.md); needs the Argo Rollouts "
            "and/or Flagger CRDs.",
        "keda": "Triton's autoscaling by KEDA on the alerts' queue signals (docs/canary-gates.md); needs KEDA.",
        "hpa": "Triton's autoscaling by an HPA over prometheus-adapter on the alerts' queue signals "
               "(docs/canary-gates.md);\n# needs prometheus-adapter with prometheus-adapter-config.yaml. Use it "
               "or keda/, not both."}


def documents(spec: Spec) -> dict[str, list[dict]]:
    """{path under OUT_DIR: objects} of the components' resources."""
    docs = {"argo-analysistemplates.yaml": [objects.analysis_template(spec, mode) for mode in objects.ARGO_TEMPLATES],
            "flagger-metrictemplates.yaml": objects.metric_templates(spec)}
    scaled, hpa = objects.scaled_object(spec), objects.hpa(spec)
    if scaled is not None:
        docs["keda/keda-scaledobject.yaml"] = [scaled]
    if hpa is not None:
        docs["hpa/hpa.yaml"] = [hpa]
    return docs


def _component(folder: str, resources: list[str]) -> str:
    body = {"apiVersion": "kustomize.config.k8s.io/v1alpha1", "kind": "Component", "resources": resources}
    return HEADER + f"# {WHAT[folder]}\n# Opt in from an overlay: `components: [<path to this folder>]`.\n" + dump(body)


def outputs(spec: Spec) -> dict[str, str]:
    docs = documents(spec)
    files = {f"{OUT_DIR}/{name}": HEADER + "---\n".join(dump(d) for d in body) for name, body in docs.items()}
    for folder in WHAT:
        prefix = f"{folder}/" if folder else ""
        resources = sorted(n.removeprefix(prefix) for n in docs if (n.rsplit("/", 1)[0] if "/" in n else "") == folder)
        if resources:
            files[f"{OUT_DIR}/{prefix}kustomization.yaml"] = _component(folder, resources)
    files[f"{OUT_DIR}/{ANALYSIS_SNIPPET}"] = (
        HEADER + "# The `spec.analysis` block of a Flagger Canary using the MetricTemplates: paste it into your "
        "Canary\n# and set templateVariables.model to the Triton model the canary serves.\n"
        + dump({"analysis": objects.canary_analysis(spec)}))
    if "hpa/hpa.yaml" in docs:
        files[f"{OUT_DIR}/{ADAPTER_CONFIG}"] = (
            HEADER + "# prometheus-adapter's configuration (its --config file) with the external metrics hpa.yaml "
            "reads.\n" + dump(objects.adapter_config(spec)))
    return files
