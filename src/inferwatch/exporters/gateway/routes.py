"""Which requests are LLM requests, decided on the same path the proxy forwards.

A request target is first made canonical (`canonical_target`): dot-segments (`.`, `..`, also written
`%2e`) are resolved as RFC 3986 §5.2.4 says and empty segments (`//`) are dropped. The proxy forwards
exactly that canonical target, and classification reads it too, so no spelling of a path can reach an
LLM route at the upstream without being metered. Targets that cannot be made canonical without guessing
how the upstream would read them, an encoded slash or backslash (`%2F`, `%5C`) or a raw backslash, are
refused (400).

Classification (`classify`) is then deliberately broad: it reads the percent-decoded path, ignores the
case of the route's fixed words and a trailing slash, so a path the upstream might serve as an LLM route
is metered; if the upstream answers 404 instead, that is metered too (as a 404).

Routes (everything else passes through unmetered):
- Triton `POST /v2/models/<m>[/versions/<v>]/generate_stream` (SSE) and `/generate`, `/infer` (JSON):
  for the models `gateway.llm_models` names, or when it is unset, generate and generate_stream of every
  model and infer of none (a Triton /infer call is an LLM call only for a model declared as one);
- the API routes of DEFAULT_ROUTES, always (they are LLM APIs), each read by its protocol's reader
  (readers.py): OpenAI-compatible `POST /v1/chat/completions` and `/v1/completions` ("openai"), the OpenAI
  Responses API `/v1/responses` ("responses"), the Anthropic Messages API `/v1/messages` ("messages") and
  `/v1/embeddings` ("embeddings": input tokens only); the spec's `gateway.routes` adds paths (a server that
  serves one of these APIs under another path) or gives a default path another protocol.
"""

from __future__ import annotations

import dataclasses
import json
import re
from urllib.parse import unquote

from yarl import URL

_TRITON_PATH = re.compile(r"^/v2/models/([^/]+)(?:/versions/[^/]+)?/(generate_stream|generate|infer)/?$",
                          re.IGNORECASE)
# Path → protocol of the API routes metered by default (docs/gateway-apis.md). A protocol here is one
# readers.READERS knows; "triton" routes come from _TRITON_PATH instead.
DEFAULT_ROUTES = {
    "/v1/chat/completions": "openai",
    "/v1/completions": "openai",
    "/v1/responses": "responses",
    "/v1/messages": "messages",
    "/v1/embeddings": "embeddings",
}
PROTOCOLS = ("openai", "responses", "messages", "embeddings")
_REFUSED = ("%2f", "%5c", "\\")


class BadTarget(ValueError):
    """A request target the proxy refuses (400): the message says why, without echoing the target."""


@dataclasses.dataclass(frozen=True)
class Route:
    """A metered request: `protocol` is "triton" or one of PROTOCOLS; `endpoint` the route's last path word
    (Triton: generate|generate_stream|infer); `model` as the client named it (or None)."""

    protocol: str
    endpoint: str
    model: str | None


def decoded_path(target: str) -> str:
    """The percent-decoded path of a target (what classification reads)."""
    return unquote(target.partition("?")[0])


def canonical_target(raw: str) -> str:
    """The origin-form target (`/path?query`, still percent-encoded) the proxy forwards for `raw`.

    Raises BadTarget for an encoded slash or backslash, a raw backslash, or a target that is neither
    origin-form nor absolute-form."""
    if not raw.startswith("/"):
        try:
            raw = URL(raw, encoded=True).raw_path_qs  # absolute-form: only its path and query are used
        except ValueError:
            raise BadTarget("request target is not a path") from None
        if not raw.startswith("/"):
            raise BadTarget("request target is not a path")
    path, sep, query = raw.partition("?")
    lowered = path.lower()
    for bad in _REFUSED:
        if bad in lowered:
            raise BadTarget("encoded slash or backslash in the path")
    segments = path.split("/")[1:]
    out: list[str] = []
    for seg in segments:
        dots = seg.replace("%2e", ".").replace("%2E", ".")
        if dots == ".":
            continue
        if dots == "..":
            if out:
                out.pop()
            continue
        if seg:
            out.append(seg)
    trailing = bool(segments) and (segments[-1] == "" or segments[-1].replace("%2e", ".").replace("%2E", ".")
                                   in (".", ".."))
    canonical = "/" + "/".join(out) + ("/" if trailing and out else "")
    return canonical + sep + query


class Classifier:
    """`classify(method, path, body)`: the Route of a request, or None (pass through). `path` is the
    percent-decoded path (aiohttp's request.path of the canonical target, ASGI's scope["path"]).

    `llm_models` is the spec's gateway.llm_models (None: generate/generate_stream of any model); `routes`
    the spec's gateway.routes (path → protocol), added to DEFAULT_ROUTES."""

    __slots__ = ("llm_models", "routes")

    def __init__(self, llm_models: list[str] | None = None, routes: dict[str, str] | None = None):
        self.llm_models = frozenset(llm_models) if llm_models is not None else None
        # Matched as classification reads a path: case of the fixed words and a trailing slash ignored.
        self.routes = {route_key(p): proto for p, proto in {**DEFAULT_ROUTES, **(routes or {})}.items()}

    def classify(self, method: str, path: str, body: bytes) -> Route | None:
        if method != "POST":
            return None
        m = _TRITON_PATH.match(path)
        if m:
            model, endpoint = m.group(1), m.group(2).lower()
            if self.llm_models is None:
                return Route("triton", endpoint, model) if endpoint != "infer" else None
            return Route("triton", endpoint, model) if model in self.llm_models else None
        key = route_key(path)
        protocol = self.routes.get(key)
        if protocol is None:
            return None
        model = None
        try:
            doc = json.loads(body) if body else None
        except (ValueError, RecursionError):  # not JSON, or nested too deeply to read ([[[[...]]]])
            doc = None
        if isinstance(doc, dict) and isinstance(doc.get("model"), str):
            model = doc["model"]
        return Route(protocol, key.rsplit("/", 1)[-1], model)


def route_key(path: str) -> str:
    """How a path is looked up in the route table: lower case, without a trailing slash."""
    path = path.lower()
    return path[:-1] if len(path) > 1 and path.endswith("/") else path
