"""Label values for gateway metrics, folded to the bounded set the spec declares.

Cardinality is bounded by configuration, never by requests (as vLLM, LiteLLM and Envoy AI Gateway do;
docs/sources.md#llm-user-experience-metrics): a tenant, model or service the spec does not declare becomes
`other`; no user, request or key ever becomes a label.
"""

from __future__ import annotations

from typing import Mapping

from inferwatch.spec import OTHER, Spec


class LabelPolicy:
    """Maps request facts (tenant header, service header, model name) to (tenant, model, tier) labels."""

    def __init__(self, spec: Spec):
        self.tenants = frozenset(spec.tenants)
        self.models = frozenset(spec.models)
        # Lower case: matches aiohttp's case-insensitive headers and ASGI's lower-case header names alike.
        self.tenant_header = spec.gateway.tenant_header.lower()
        self.service_header = spec.gateway.service_header.lower()
        self._tier_of_service = {s: name for name, tier in spec.tiers.items() for s in tier.services}

    def tenant(self, value: str | None) -> str:
        return value if value in self.tenants else OTHER

    def model(self, value: str | None) -> str:
        return value if value in self.models else OTHER

    def tier(self, service: str | None) -> str:
        # Same mapping as Spec.tier_of_service, precomputed: this runs once per request.
        return self._tier_of_service.get(service, OTHER) if service is not None else OTHER

    def from_headers(self, headers: Mapping[str, str], model: str | None) -> tuple[str, str, str]:
        """(tenant, model, tier) from request headers (case-insensitive or lower-case keys) and the model name."""
        return (self.tenant(headers.get(self.tenant_header)), self.model(model),
                self.tier(headers.get(self.service_header)))
