"""Which server serves each model: the spec's `upstreams` (a mixed fleet: Triton next to an OpenAI-compatible
server such as vLLM, TGI or SGLang, behind one gateway).

Without `upstreams` every declared model is a Triton model, as before the section existed. With it, a model
is served by the upstream that lists it in `models`, else by the default upstream (the one marked `default`,
else the first). Only Triton models are judged by the Triton-only rules (TritonModelNotLoaded), their
runbooks' Triton evidence and triage; an OpenAI-compatible server has no Triton API or `nv_*` series.

The gateway picks the upstream of each request (`choose`): the longest `path_prefix` the request path starts
with, else the upstream listing the request's model, else the default one.
"""

from __future__ import annotations

import dataclasses
import re
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from inferwatch.specload import SpecError, field

if TYPE_CHECKING:
    from inferwatch.spec import Spec

__all__ = ["Upstream", "KINDS", "TRITON", "kind_of", "upstream_of", "triton_models", "default_name",
           "choose", "validate_upstreams"]

TRITON = "triton"
# triton: Triton's HTTP API (KServe v2, generate); openai: an OpenAI-compatible server (/v1/...);
# other: any HTTP server the gateway forwards to without Triton's semantics.
KINDS = (TRITON, "openai", "other")
_NAME = re.compile(r"[a-z][a-z0-9_-]{0,62}")  # also the `upstream` label value


@dataclasses.dataclass
class Upstream:
    """One server behind the gateway. Its key in `upstreams` is the `upstream` label of its failures."""

    url: str = field(doc="base URL the gateway forwards to, e.g. http://vllm:8000 (no user:password@: the "
                         "spec is written to ConfigMaps and logs; give credentials to the gateway's --upstream)")
    kind: str = field(TRITON, doc="triton, openai (an OpenAI-compatible server: vLLM, TGI, SGLang) or other; "
                                  "Triton-only rules, runbooks and triage apply to models of a triton upstream")
    models: list[str] = field([], doc="models it serves (the name in the request: Triton's path, OpenAI's "
                                      "`model`); added to the spec's `models`")
    path_prefix: str = field("", doc="requests whose path starts with this go here (before the model name), "
                                     "e.g. /vllm/; forwarded unchanged")
    default: bool = field(False, doc="takes the requests no other upstream claims; default: the first upstream")

    def _validate(self, path: str) -> None:
        if not self.url.startswith(("http://", "https://")):
            # The value is not echoed: it may hold credentials.
            raise SpecError(f"{path}.url", "expected an http(s) URL such as http://vllm:8000")
        if "@" in urlsplit(self.url).netloc:
            raise SpecError(f"{path}.url", "expected no user:password@ in the URL (the value is not shown): the "
                                           "spec is written to ConfigMaps and logs")
        if self.kind not in KINDS:
            raise SpecError(f"{path}.kind", f"expected one of {', '.join(KINDS)}, got {self.kind!r}")
        if self.path_prefix and not self.path_prefix.startswith("/"):
            raise SpecError(f"{path}.path_prefix", f"expected a path starting with '/', got {self.path_prefix!r}")


def default_name(spec: Spec) -> str | None:
    """The upstream taking unclaimed requests and models (None without `upstreams`)."""
    for name, up in spec.upstreams.items():
        if up.default:
            return name
    return next(iter(spec.upstreams), None)


def upstream_of(spec: Spec, model: str) -> str | None:
    """The name of the upstream serving `model` (None without `upstreams`)."""
    for name, up in spec.upstreams.items():
        if model in up.models:
            return name
    return default_name(spec)


def kind_of(spec: Spec, model: str) -> str:
    """`triton`, `openai` or `other`: the kind of server serving `model` (triton without `upstreams`)."""
    name = upstream_of(spec, model)
    return spec.upstreams[name].kind if name is not None else TRITON


def triton_models(spec: Spec) -> list[str]:
    """The declared models (spec `models`, in order) served by Triton."""
    return [m for m in spec.models if kind_of(spec, m) == TRITON]


def choose(spec: Spec, path: str, model: str | None) -> str | None:
    """The upstream of one request: the longest matching `path_prefix`, else the one listing `model`, else
    the default (None without `upstreams`)."""
    best, length = None, -1
    for name, up in spec.upstreams.items():
        if up.path_prefix and path.startswith(up.path_prefix) and len(up.path_prefix) > length:
            best, length = name, len(up.path_prefix)
    if best is not None:
        return best
    if model is not None:
        for name, up in spec.upstreams.items():
            if model in up.models:
                return name
    return default_name(spec)


def validate_upstreams(spec: Spec) -> None:
    """Spec checks across `upstreams`, `models` and `layers.L2.models`; adds each upstream's models to
    `spec.models`. Raises SpecError naming the field."""
    defaults = [name for name, up in spec.upstreams.items() if up.default]
    if len(defaults) > 1:
        raise SpecError(f"upstreams.{defaults[1]}.default", f"{defaults[0]} is the default upstream already")
    owner: dict[str, str] = {}
    prefixes: dict[str, str] = {}
    for name, up in spec.upstreams.items():
        if not _NAME.fullmatch(name):
            raise SpecError(f"upstreams.{name}", "expected a name of lower-case letters, digits, '_' or '-' "
                                                 "(it becomes the `upstream` label)")
        for model in up.models:
            if model in owner:
                raise SpecError(f"upstreams.{name}.models", f"{model!r} is served by upstream {owner[model]!r} "
                                                            "already: a model has one upstream")
            owner[model] = name
            if model not in spec.models:
                spec.models.append(model)
        if up.path_prefix:
            if up.path_prefix in prefixes:
                raise SpecError(f"upstreams.{name}.path_prefix",
                                f"{up.path_prefix!r} is upstream {prefixes[up.path_prefix]!r}'s already")
            prefixes[up.path_prefix] = name
    for model in spec.layers.L2.models:
        kind = kind_of(spec, model)
        if kind != TRITON:
            raise SpecError(f"layers.L2.models.{model}",
                            f"is served by upstream {upstream_of(spec, model)!r} ({kind}), not Triton: "
                            "L2 overrides apply to Triton models only")
