"""POST /sim/events: the simulator's test-only input (fault injection at run time), bounded.

Takes a JSON (or YAML) list of scenario timeline entries (scenario.py), `at` counted from the moment they
arrive, e.g. `[{"gpu": 0, "ramp": {"temperature_c": 92}, "over": "30s"}]`; answers 200 `{"added": N}`, or
4xx with a short reason, and nothing is added then.

Limits, each answered with its own status:
  - only from loopback peers unless the exporter was started with --sim-events-from-any-host (403)
  - body at most MAX_BODY_BYTES (413); YAML anchors/aliases refused (400), so a few hundred bytes cannot
    expand into a huge structure; nesting too deep for the parser (400)
  - error texts at most MAX_ERROR_CHARS characters, so an answer stays small whatever was posted
  - the simulator's timeline holds at most sim.MAX_TIMELINE entries (400 once full)
"""

from __future__ import annotations

import ipaddress
import json
import logging
from typing import Any, Callable

import yaml

from inferwatch.specload import SpecError, UniqueKeyLoader

log = logging.getLogger(__name__)
MAX_BODY_BYTES = 64 * 1024
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


def handle(sim: Any, environ: dict, start_response: Callable, any_host: bool) -> list[bytes]:
    """The WSGI answer to one request for /sim/events."""
    if not any_host and not is_loopback(environ.get("REMOTE_ADDR", "")):
        return answer(start_response, "403 Forbidden", {"error": "POST /sim/events is a test-only endpoint, "
                      "accepted from loopback only (start the exporter with --sim-events-from-any-host to allow "
                      "other hosts)"})
    if environ.get("REQUEST_METHOD") != "POST":
        return answer(start_response, "405 Method Not Allowed", {"error": "POST a list of events"})
    try:
        length = int(environ.get("CONTENT_LENGTH") or 0)
    except ValueError:
        length = -1
    if length < 0:
        return answer(start_response, "400 Bad Request", {"error": "bad Content-Length"})
    if length > MAX_BODY_BYTES:
        return answer(start_response, "413 Payload Too Large", {"error": f"body over {MAX_BODY_BYTES} bytes"})
    raw = environ["wsgi.input"].read(length) if length else b""
    try:
        changes = sim.add_events(parse_events(raw))
    except (ValueError, SpecError) as exc:  # SpecError is a ValueError; named for the reader
        return answer(start_response, "400 Bad Request", {"error": short(str(exc))})
    log.info("simulator: %d event(s) added at t=%.1fs", len(changes), sim.now())
    return answer(start_response, "200 OK", {"added": len(changes)})


def answer(start_response: Callable, status: str, body: dict) -> list[bytes]:
    data = json.dumps(body).encode()
    start_response(status, [("Content-Type", "application/json"), ("Content-Length", str(len(data)))])
    return [data]
