"""Canary gates and autoscaling signals generated from the same spec and recording rules as the alerts
(docs/canary-gates.md): Argo Rollouts AnalysisTemplates, Flagger MetricTemplates and a Canary's analysis
block, and a KEDA ScaledObject, written to deploy/kubernetes/gates/ (a kustomize component)."""
