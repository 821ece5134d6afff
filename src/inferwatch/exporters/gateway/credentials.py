"""What credential the upstream receives (spec `gateway.upstream_authorization`, docs/security.md "Gateway").

Unset (the default): the client's own credential headers are forwarded as sent, so an upstream that
authenticates users (an OpenAI-compatible server with its own keys) sees the user's key; with `--upstream
http://user:pass@host` and no client `Authorization`, the URL's credentials are sent as Basic auth.

Set (a secret reference to the whole `Authorization` value, e.g. `Bearer <token>`): every client credential
header (`Authorization`, `X-Api-Key` of the Anthropic Messages API, `Api-Key` of Azure OpenAI) is removed
from every forwarded request and call, HTTP and gRPC, metered or not, and that one value is sent instead. A
tenant API key of `gateway.tenant_api_keys` (which bills the request) then never leaves the gateway, and the
upstream trusts the gateway alone. It takes precedence over credentials in the `--upstream` URL.
"""

from __future__ import annotations

from inferwatch.spec import Spec, SpecError

# Request headers (lower case) that carry a client's credential to an LLM API.
CLIENT_CREDENTIALS = frozenset(("authorization", "x-api-key", "api-key"))
PATH = "gateway.upstream_authorization"


class UpstreamCredential:
    """The spec's replacement credential, read once at start. Raises SpecError (naming PATH, never the value)
    when the secret does not resolve or holds a line break or control character (it would split the head)."""

    def __init__(self, spec: Spec):
        secret = spec.gateway.upstream_authorization
        self.value: str | None = None
        if secret is None:
            return
        value = secret.reveal().strip()
        if not value or any(ord(c) < 0x20 or ord(c) == 0x7F for c in value):
            raise SpecError(PATH, "expected one non-empty header value without line breaks or control characters")
        self.value = value

    @property
    def replaces(self) -> bool:
        return self.value is not None

    def apply(self, headers: list, key: str = "Authorization") -> list:
        """`headers` ((name, value) pairs) without the client's credentials, with the spec's one added under
        `key` ("authorization" for gRPC metadata, whose keys are lower case); unchanged when unset."""
        if self.value is None:
            return headers
        return [(k, v) for k, v in headers if k.lower() not in CLIENT_CREDENTIALS] + [(key, self.value)]
