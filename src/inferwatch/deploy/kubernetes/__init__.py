"""deploy/kubernetes/: inferwatch on Kubernetes with the Prometheus Operator and the GPU Operator, generated
from the spec (`inferwatch generate`). A kustomize base rather than a Helm chart: the spec already holds every
value a chart's values.yaml would, so the manifests are written out in full, reviewed as plain YAML and
checked by `generate --check`; `kubectl apply -k` needs no other tool, and an overlay adapts image,
namespace or resources without templating.

  specfile    the spec the pods read (in-cluster addresses, secrets by reference)
  workloads   DaemonSet, Deployments, StatefulSet, Services, HorizontalPodAutoscaler, PodDisruptionBudget
  monitoring  PodMonitor/ServiceMonitors, AlertmanagerConfig, dashboard ConfigMaps
  generate    the files and kustomization.yaml
"""
