"""Generator of deploy/kubernetes/gates/: a kustomize Component (kustomize.config.k8s.io/v1alpha1) with the
Argo Rollouts AnalysisTemplates, the Flagger MetricTemplates and the KEDA ScaledObject, which an overlay opts
into with `components: [<path to deploy/kubernetes/gates>]` (it needs those controllers' CRDs); and
`flagger-canary-analysis.yaml`, the `analysis` block of a Flagger Canary to paste into yours (not a
resource: a Canary names your own workload). Registered in `inferwatch generate`, so `--check` fails when
a file is stale."""

from __future__ import annotations

from inferwatch.gates import objects
from inferwatch.rules.generate import HEADER, dump
from inferwatch.spec import Spec

OUT_DIR = "deploy/kubernetes/gates"
ANALYSIS_SNIPPET = "flagger-canary-analysis.yaml"


def documents(spec: Spec) -> dict[str, list[dict]]:
    """{file name: objects} of the component's resources."""
    docs = {"argo-analysistemplates.yaml": [objects.analysis_template(spec, mode) for mode in objects.ARGO_TEMPLATES],
            "flagger-metrictemplates.yaml": objects.metric_templates(spec)}
    scaled = objects.scaled_object(spec)
    if scaled is not None:
        docs["keda-scaledobject.yaml"] = [scaled]
    return docs


def outputs(spec: Spec) -> dict[str, str]:
    docs = documents(spec)
    files = {f"{OUT_DIR}/{name}": HEADER + "---\n".join(dump(d) for d in body) for name, body in docs.items()}
    component = {"apiVersion": "kustomize.config.k8s.io/v1alpha1", "kind": "Component", "resources": sorted(docs)}
    files[f"{OUT_DIR}/kustomization.yaml"] = (
        HEADER + "# Canary gates and autoscaling from the alerts' recording rules (docs/canary-gates.md); opt in "
        "from an\n# overlay with `components: [<path to this folder>]` (needs the Argo Rollouts, Flagger and KEDA "
        "CRDs).\n" + dump(component))
    files[f"{OUT_DIR}/{ANALYSIS_SNIPPET}"] = (
        HEADER + "# The `spec.analysis` block of a Flagger Canary using the MetricTemplates: paste it into your "
        "Canary\n# and set templateVariables.model to the Triton model the canary serves.\n"
        + dump({"analysis": objects.canary_analysis(spec)}))
    return files
