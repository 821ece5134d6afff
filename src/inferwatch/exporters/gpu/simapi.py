"""POST /sim/events: the simulator's test-only input (fault injection at run time), bounded.

Takes a JSON (or YAML) list of scenario timeline entries (scenario.py), `at` counted from the moment they
arrive, e.g. `[{"gpu": 0, "ramp": {"temperature_c": 92}, "over": "30s"}]`; answers 200 `{"added": N}`, or
4xx with a short reason, and nothing is added then.

Limits, each answered with its own status:
  - only from loopback peers unless the exporter was started with --sim-events-from-any-host (403)
  - body at most MAX_BODY_BYTES (413), received within BODY_TIMEOUT_S (408); YAML anchors/aliases refused
    (400), so a few hundred bytes cannot expand into a huge structure; nesting too deep for the parser (400)
  - error texts at most MAX_ERROR_CHARS characters, so an answer stays small whatever was posted
  - the simulator's timeline holds at most sim.MAX_TIMELINE entries (400 once full)
"""

from __future__ import annotations

import ipaddress
import logging
from typing import Any

import yaml

from inferwatch.specload import SpecError, UniqueKeyLoader

log = logging.getLogger(__name__)
MAX_BODY_BYTES = 64 * 1024
BODY_TIMEOUT_S = 10.0
MAX_ERROR_CHARS = 300


class _NoAliasLoader(UniqueKeyLoader):
    """Safe YAML (duplicate keys refused) without aliases: an alias is an error, never an expansion."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            raise yaml.composer.ComposerError(None, None, "YAML aliases (*name) are not accepted here",
                                              self.peek_event().start_mark)
        return super().compose_node(parent, index)


def parse_events(raw: bytes) -> Any:
    """The posted entries as plain data. Raises ValueError with a short reason."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError("body is not UTF-8 text") from None
    try:
        return yaml.load(text, Loader=_NoAliasLoader) if text.strip() else None  # noqa: S506 - SafeLoader
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        raise ValueError(f"body is not JSON or YAML: {where}{getattr(exc, 'problem', None) or exc}") from None
    except RecursionError:
        raise ValueError("body is nested too deeply") from None


def is_loopback(address: str) -> bool:
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    mapped = getattr(ip, "ipv4_mapped", None)
    return ip.is_loopback or bool(mapped and mapped.is_loopback)


def short(text: str) -> str:
    return text if len(text) <= MAX_ERROR_CHARS else text[:MAX_ERROR_CHARS - 1] + "…"


def forbidden(remote: str, any_host: bool) -> dict | None:
    """The 403 answer for a peer that may not post events (not loopback, without --sim-events-from-any-host),
    else None."""
    if any_host or is_loopback(remote):
        return None
    return {"error": "POST /sim/events is a test-only endpoint, accepted from loopback only (start the "
                     "exporter with --sim-events-from-any-host to allow other hosts)"}


def too_large() -> dict:
    return {"error": f"body over {MAX_BODY_BYTES} bytes"}


def apply(sim: Any, raw: bytes) -> tuple[int, dict]:
    """Add the events posted as `raw` to `sim`: (200, {"added": N}), or (400, {"error": reason}) and nothing
    added."""
    try:
        changes = sim.add_events(parse_events(raw))
    except (ValueError, SpecError) as exc:  # SpecError is a ValueError; named for the reader
        return 400, {"error": short(str(exc))}
    log.info("simulator: %d event(s) added at t=%.1fs", len(changes), sim.now())
    return 200, {"added": len(changes)}
