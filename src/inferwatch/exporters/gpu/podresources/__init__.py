"""The kubelet's PodResources v1 API: api.proto and the stubs generated from it (see generate.py)."""
