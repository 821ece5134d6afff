"""Slack incoming webhook: a Block Kit message whose text from alerts is never parsed as markup.

Escaping (https://api.slack.com/reference/surfaces/formatting, Block Kit reference): `mrkdwn` text treats
`&`, `<`, `>` as control characters (links, `<!channel>`, `<@U123>` mentions) and `*`, `_`, `~`, `` ` ``
as formatting, with no escape for the latter, so `llama_3_8b_instruct` can lose its underscores to
italics. Values from alerts therefore never go into mrkdwn: the title is a `plain_text` header
(emoji shortcodes not converted), and everything else is a `rich_text` block, whose `text` elements are
shown as written (mentions exist there only as explicit `user`/`broadcast` elements, which we never build).
The only mrkdwn-parsed field is the top-level `text`, the notification fallback: it carries the title with
`&`, `<`, `>` escaped as entities, which Slack shows as the original characters.

Message: header (title with counts), the shared key labels and details, one block per alert (status,
the template's lines, identity labels, details, Runbook/Prometheus links), triage, Runbook/Alertmanager/
Prometheus buttons. Limits: header ≤ 150 characters, ≤ 50 blocks, section text ≤ 3,000 characters (kept
for every block), and a cumulative limit Slack does not document: it answers `msg_blocks_too_long` near
12,000 characters of text (slackapi/bolt-js#2509), so messages are rendered within MESSAGE_MAX_CHARS,
cutting the longest fields first; when even MIN_FIELD_CHARS per field does not fit, one line per alert.
Several groups in one message (a backlog held back by the rate): one line per group (common.digest_lines) in
as many blocks as fit, the groups that do not fit counted by name in a last line.
Answers: HTTP 200 `ok`; 400 with a short text (`invalid_blocks`, `no_text`, `msg_too_long`,
`msg_blocks_too_long`), 403 `invalid_token`, 404 `no_service`, 429 with Retry-After.
"""

from __future__ import annotations

import math
from typing import Any

from inferwatch.notifier.channels.base import DeliveryResult, HttpChannel, reveal, too_long
from inferwatch.notifier.channels.common import (
    DIGEST_MORE_NAMES,
    DIGEST_VALUE_CHARS,
    AlertView,
    DigestLine,
    GroupView,
    coalesced_title,
    counts_by_name,
    digest_lines,
    group_title,
    group_view,
    is_http_url,
    omitted_names,
)
from inferwatch.notifier.channels.template import SLACK_MARKERS, Run, cut_run, template_lines
from inferwatch.notifier.channels.text import MIN_FIELD_CHARS, cut_runes, fit_field_cap
from inferwatch.notifier.model import Notification
from inferwatch.spec import Channel as ChannelSpec

HEADER_MAX_CHARS = 150
BLOCK_MAX_CHARS = 3000        # a section's text limit; kept for rich_text blocks too
MAX_BLOCKS = 50
MESSAGE_MAX_CHARS = 10_000    # text in all blocks; Slack's msg_blocks_too_long came near 12,000-13,000
FIELD_MAX_CHARS = 1500        # one description or annotation, at most
MAX_ALERT_BLOCKS = 20         # one group: alerts shown as their own blocks, the rest counted
DEFAULT_ALERT_TEMPLATE = "*${summary}*\n${description}"
EMOJI = {"firing": "rotating_light", "resolved": "white_check_mark"}
STYLES = ("bold", "italic", "strike", "code")


def escape(text: str) -> str:
    """mrkdwn escaping of the control characters &, < and > (api.slack.com formatting reference)."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def text_chars(node) -> int:
    """Characters of text in a block tree: every `text` and `url` string (what Slack's limit counts, and a
    little more)."""
    if isinstance(node, list):
        return sum(text_chars(x) for x in node)
    if isinstance(node, dict):
        return sum(len(v) if k in ("text", "url") and isinstance(v, str) else text_chars(v)
                   for k, v in node.items())
    return 0


# ------------------------------------------------------------------------------------- rich text pieces
def _el(text: str, styles=()) -> dict:
    el: dict[str, Any] = {"type": "text", "text": text}
    style = {s: True for s in STYLES if s in styles}
    if "marker" in styles:
        style["italic"] = True  # a cut marker reads as ours, not as part of the value
    if style:
        el["style"] = style
    return el


def _runs(runs: list[Run]) -> list[dict]:
    return [_el(r.text, r.styles) for r in runs if r.text]


def _value(text: str, cap: int, styles=()) -> list[dict]:
    return _runs(cut_run(Run(text, True, frozenset(styles)), cap))


def _pairs(pairs: list[tuple[str, str]], cap: int, sep: str, value_styles=()) -> list[dict]:
    out: list[dict] = []
    for i, (k, v) in enumerate(pairs):
        out.append(_el((sep if i else "") + f"{k}="))
        out += _value(v, cap, value_styles)
    return out


def _rich(elements: list[dict]) -> dict:
    return {"type": "rich_text", "elements": [{"type": "rich_text_section", "elements": elements}]}


def _status(status: str) -> list[dict]:
    return [{"type": "emoji", "name": EMOJI.get(status, "bell")}, _el(" "), _el(status.upper(), ("bold",))]


class SlackChannel(HttpChannel):
    kind = "slack"
    rate_per_minute = 60       # "about one message per second" per webhook (Slack rate limits)
    size_unit = "characters of block text"

    def __init__(self, name: str, spec: ChannelSpec):
        super().__init__(name, spec)
        self.template = spec.template or DEFAULT_ALERT_TEMPLATE

    # ------------------------------------------------------------------------------------ one group
    def build_message(self, n: Notification) -> dict:
        budget = self.budget(MESSAGE_MAX_CHARS, n)
        if n.coalesced:
            message = self._coalesced(n, budget)
        else:
            view = group_view(n.groups[0], self.template)
            message = fit_field_cap(lambda cap: self._sized(self._group(n, view, cap)), budget, FIELD_MAX_CHARS) \
                or self._compact(n, view, budget)
        self.last_size = text_chars(message["blocks"])
        return message

    def _sized(self, message: dict) -> tuple[dict, float]:
        blocks = message["blocks"]
        too_big = len(blocks) > MAX_BLOCKS or any(text_chars(b) > BLOCK_MAX_CHARS for b in blocks[1:])
        return message, math.inf if too_big else text_chars(blocks)

    def _title(self, n: Notification) -> str:
        title = group_title(n.groups[0]) if not n.coalesced else coalesced_title(n)
        return ("[ESCALATED] " if n.escalated else "") + title

    def _head(self, n: Notification, title: str) -> list[dict]:
        return [{"type": "header", "text": {"type": "plain_text", "emoji": False,
                                            "text": cut_runes(title, HEADER_MAX_CHARS)}}]

    def _group(self, n: Notification, view: GroupView, cap: int) -> dict:
        blocks = self._head(n, self._title(n))
        info: list[dict] = []
        for i, (k, v) in enumerate(view.key_labels):
            info += [_el(("   " if i else "") + f"{k}: ", ("bold",))] + _value(v, cap)
        if view.details:
            info += ([_el("\n")] if info else []) + [_el("Details: ", ("italic",))] + _pairs(view.details, cap, "  ")
        if info:
            blocks.append(_rich(info))
        shown = view.alerts[:MAX_ALERT_BLOCKS]
        for alert in shown:
            blocks.append(_rich(self._alert_elements(alert, cap)))
        note = self._cut_note(view, shown, cap)
        if note:
            blocks.append(_rich([_el(note, ("italic",))]))
        rest = self._listing(view, view.alerts[len(shown):], BLOCK_MAX_CHARS)
        if rest:
            blocks.append(_rich(rest))
        if n.enrichment:
            blocks.append(_rich([_el("Triage: ", ("bold",))] + _value(n.enrichment, cap)))
        blocks += self._buttons(view)
        return {"text": cut_runes(escape(self._title(n)), BLOCK_MAX_CHARS), "blocks": blocks}

    def _cut_note(self, view: GroupView, shown: list[AlertView], cap: int) -> str:
        """What the message leaves out, counted: `3 of the 20 alerts shown are shortened (cut fields end in
        "…[cut"); the other 180 follow in one line each, those that do not fit counted at the end`; '' when
        every alert is there whole."""
        shortened = sum(1 for a in shown if self._alert_elements(a, cap) != self._alert_elements(a, 10**9))
        rest = len(view.alerts) - len(shown)
        parts = []
        if shortened:
            parts.append(f"{shortened} of the {len(shown)} alerts shown are shortened (cut fields end in \"…[cut\")")
        if rest:
            parts.append(f"the other {rest} follow in one line each, those that do not fit counted at the end")
        text = "; ".join(parts)
        return text[:1].upper() + text[1:]

    def _alert_elements(self, alert: AlertView, cap: int) -> list[dict]:
        els = _status(alert.status)
        lines = template_lines(self.template, alert.fields, SLACK_MARKERS, cap)
        for i, line in enumerate(lines):
            els += [_el("\n" if i else " ")] + _runs(line)
        if alert.identity:
            els += [_el("\n")] + _pairs(alert.identity, cap, "  ", ("code",))
        if alert.details:
            els += [_el("\n"), _el("Details: ", ("italic",))] + _pairs(alert.details, cap, "  ")
        for i, (text, url) in enumerate(alert.links):
            els += [_el("\n" if i == 0 else "  "), {"type": "link", "url": url, "text": text}]
        return els

    def _buttons(self, view: GroupView) -> list[dict]:
        first = view.first
        links = dict(first.links)
        buttons = []
        for text, url in (("Runbook", links.get("Runbook", "")), ("Alertmanager", view.group.external_url),
                          ("Prometheus", links.get("Prometheus", ""))):
            if is_http_url(url):
                buttons.append({"type": "button", "text": {"type": "plain_text", "text": text}, "url": url})
        return [{"type": "actions", "elements": buttons}] if buttons else []

    def _line(self, view: GroupView, alert: AlertView) -> list[dict]:
        """An alert in one line: status, its name when it is not the group's, its identity labels."""
        els = _status(alert.status)
        if alert.name != view.group.common_labels.get("alertname") or not alert.identity:
            els += [_el(" ")] + _value(alert.name or "(no alertname)", MIN_FIELD_CHARS)
        if alert.identity:
            els += [_el(" ")] + _pairs(alert.identity, MIN_FIELD_CHARS, " ", ("code",))
        return els

    def _listing(self, view: GroupView, alerts: list[AlertView], room: int) -> list[dict]:
        """`alerts` one line each within `room` characters, the rest counted; then the alerts Alertmanager
        left out of the payload."""
        lines = [self._line(view, a) for a in alerts]
        if view.group.truncated_alerts:
            lines.append([_el(f"{view.group.truncated_alerts} more alert(s) not included by Alertmanager "
                              "(its max_alerts), see Alertmanager", ("italic",))])
        return _fit_element_lines(lines, room, lambda k: f"…and {k} more, see Alertmanager") if lines else []

    def _compact(self, n: Notification, view: GroupView, budget: int) -> dict:
        """The first alert with short fields, if it fits, and every alert in one line; the rest counted."""
        head = self._head(n, self._title(n))
        buttons = self._buttons(view)
        room = budget - text_chars(head) - text_chars(buttons)
        blocks: list[dict] = []
        for cap in (300, 120, MIN_FIELD_CHARS):
            first = _rich(self._alert_elements(view.first, cap))
            if text_chars(first) <= min(BLOCK_MAX_CHARS, room // 2):
                blocks = [first]
                note = self._cut_note(view, [view.first], cap)
                if note:
                    blocks.append(_rich([_el(note, ("italic",))]))
                break
        others = view.alerts[1:] if blocks else view.alerts
        listing = self._listing(view, others, min(BLOCK_MAX_CHARS, room - text_chars(blocks)))
        if listing:
            blocks.append(_rich(listing))
        return {"text": cut_runes(escape(self._title(n)), BLOCK_MAX_CHARS), "blocks": head + blocks + buttons}

    # ------------------------------------------------------------------------------------ digests
    def _coalesced(self, n: Notification, budget: int) -> dict:
        """Header, alerts counted by name (within a quarter of the budget), one line per group (see
        common.digest_lines) in as many blocks as fit `budget` characters and MAX_BLOCKS, then a line
        counting the groups left out by name, and the Alertmanager button."""
        title = self._title(n)
        head = self._head(n, title)
        buttons = []
        if is_http_url(n.groups[0].external_url):
            buttons = [{"type": "actions", "elements": [{"type": "button", "text": {
                "type": "plain_text", "text": "Alertmanager"}, "url": n.groups[0].external_url}]}]
        counts = [[_el("• ")] + _value(name or "(no alertname)", MIN_FIELD_CHARS) + [_el(f" ({status}): {c}")]
                  for name, status, c in counts_by_name(n)]
        room = min(BLOCK_MAX_CHARS, max(200, (budget - text_chars(head)) // 4))
        blocks = head + [_rich([_el("Alerts by name:\n", ("bold",))]
                               + _fit_element_lines(counts, room, lambda k: f"…and {k} more name(s)"))]
        lines = digest_lines(n)
        room = budget - text_chars(blocks) - text_chars(buttons)
        packed, used = self._pack(lines, room, MAX_BLOCKS - len(blocks) - len(buttons) - 1)
        shown = len(used)
        more = None
        while shown < len(lines):
            # Every name counted, at the cost of a few lines; fewer names only when no line is left.
            more = self._more_groups(lines[shown:], room - (used[shown - 1] if shown else 0), all_names=shown > 0)
            if more is not None or shown == 0:
                break
            shown -= 1
        blocks += _cut_packed(packed, shown)
        if shown < len(lines):
            blocks.append(_rich(more or [_el(f"…and {len(lines) - shown} more group(s)", ("italic",))]))
        return {"text": cut_runes(escape(title), BLOCK_MAX_CHARS), "blocks": blocks + buttons}

    @staticmethod
    def _digest_line(line: DigestLine) -> list[dict]:
        """`:rotating_light: [FIRING:1] GpuXidError · critical · node=node-a gpu=3 · Runbook`: values as
        rich-text elements (shown as written), each cut to DIGEST_VALUE_CHARS."""
        els = [{"type": "emoji", "name": EMOJI.get(line.status, "bell")}, _el(f" {line.tag} ")]
        els += _value(line.name or "(no alertname)", DIGEST_VALUE_CHARS, ("bold",))
        if line.severity:
            els += [_el(" · ")] + _value(line.severity, DIGEST_VALUE_CHARS)
        if line.labels:
            els += [_el(" · ")] + _pairs(line.labels, DIGEST_VALUE_CHARS, " ", ("code",))
        if line.more_labels:
            els.append(_el(f" (+{line.more_labels} label(s))"))
        if line.counts:
            els.append(_el(f" — {line.counts}"))
        if line.runbook:
            els += [_el(" · "), {"type": "link", "url": line.runbook, "text": "Runbook"}]
        return els

    def _pack(self, lines: list[DigestLine], room: int, max_blocks: int) -> tuple[list[list[list[dict]]], list[int]]:
        """The group lines, in order, as blocks of lines (each block ≤ BLOCK_MAX_CHARS) within `room`
        characters and `max_blocks`; and the characters used after each line packed. Rendering stops at the
        first line that does not fit, so a digest of thousands of groups renders only what it shows."""
        label = [_el("Groups:\n", ("bold",))]
        blocks: list[list[list[dict]]] = []
        used: list[int] = []
        total = block_size = 0
        for line in lines:
            els = self._digest_line(line)
            size = text_chars(els)
            new_block = not blocks or block_size + 1 + size > BLOCK_MAX_CHARS
            if new_block:
                size += text_chars(label) if not blocks else 0
                if len(blocks) == max_blocks or size > BLOCK_MAX_CHARS:
                    break
            else:
                size += 1  # the newline before it
            if total + size > room:
                break
            if new_block:
                blocks.append([])
                block_size = 0
            blocks[-1].append(els)
            block_size += size
            total += size
            used.append(total)
        return blocks, used

    @staticmethod
    def _more_groups(omitted: list[DigestLine], room: int, all_names: bool = False) -> list[dict] | None:
        """`…and 12 more group(s) not shown: 10 × GpuXidError (firing), 2 × TritonServerDown (resolved) — see
        Alertmanager`, naming as many of the DIGEST_MORE_NAMES most frequent names as fit `room` characters
        (the others counted as names; with `all_names`, all of those or None); None when not even the count
        fits."""
        names = omitted_names(omitted)
        most = min(DIGEST_MORE_NAMES, len(names))
        for keep in range(most, most - 1 if all_names else -1, -1):
            els = [_el(f"…and {len(omitted)} more group(s) not shown: ", ("italic",))]
            for i, (name, status, c) in enumerate(names[:keep]):
                els += [_el(f"{', ' if i else ''}{c} × ")] + _value(name or "(no alertname)", DIGEST_VALUE_CHARS) \
                    + [_el(f" ({status})")]
            if len(names) > keep:
                els.append(_el(f"{', ' if keep else ''}{len(names) - keep} other name(s)"))
            els.append(_el(" — see Alertmanager", ("italic",)))
            if text_chars(els) <= min(room, BLOCK_MAX_CHARS):
                return els
        return None

    # ------------------------------------------------------------------------------------ sending
    def deliver(self, notification: Notification) -> DeliveryResult:
        url = reveal(self.spec.url)
        resp, result = self.post(url, self.build_message(notification), secrets=[url])
        if resp is not None and resp.status_code in (400, 413) and "too_long" in resp.text:
            return too_long(result)  # msg_too_long, msg_blocks_too_long
        return result


def _cut_packed(packed: list[list[list[dict]]], shown: int) -> list[dict]:
    """The first `shown` lines of `packed` (blocks of lines) as rich-text blocks, "Groups:" before the first."""
    out: list[dict] = []
    for block in packed:
        lines = block[:shown]
        shown -= len(lines)
        if not lines:
            break
        els: list[dict] = [_el("Groups:\n", ("bold",))] if not out else []
        for i, line in enumerate(lines):
            els += ([_el("\n")] if i else []) + line
        out.append(_rich(els))
    return out


def _fit_element_lines(lines: list[list[dict]], room: int, more) -> list[dict]:
    """Whole lines of rich-text elements, one per line, within `room` characters; then more(omitted) in
    italics for the lines that did not fit."""
    out: list[dict] = []
    used = 0
    for i, line in enumerate(lines):
        sep = [_el("\n")] if out else []
        size = text_chars(sep + line)
        left = len(lines) - i
        tail = 0 if left == 1 else len(more(left - 1)) + 1
        if used + size + tail > room:
            return out + sep + [_el(more(left), ("italic",))]
        out += sep + line
        used += size
    return out
