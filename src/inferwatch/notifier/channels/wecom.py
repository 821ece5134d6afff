"""WeCom (企业微信) group robot: a markdown message when every value from the alerts can be shown exactly in
it, a plain-text message otherwise; at most 4096 (markdown) or 2048 (text) UTF-8 bytes.

Facts (https://developer.work.weixin.qq.com/document/path/91770): POST `.../cgi-bin/webhook/send?key=KEY`
with `{"msgtype":"markdown","markdown":{"content":...}}` or `{"msgtype":"text","text":{"content":...,
"mentioned_list":[...],"mentioned_mobile_list":[...]}}`. Markdown supports headings (`#`), bold (`**`),
links (`[t](url)`), inline code (`` `code` ``, one line), quotes (`>`), `<font color="info|comment|warning">`
and `<@userid>` mentions; there is no documented escape. Text content is shown as written and mentions
only through the two lists. Every answer is HTTP 200 with `errcode` (0 ok, 40058 content too long, 45009
rate limited, 93000 invalid webhook key); 20 messages per minute per robot.

Exactness: a value goes into markdown as it is when it contains no character markdown could interpret
(MD_SPECIAL, control characters, edge spaces), else as an inline code span when it has no backtick, `<`,
`&`, control character or edge space (code spans show their content literally; `<` and `&` are left out
because `<@userid>`, `<font>` and entities may be interpreted anyway). A value that fits neither — a
mention string, a `<font>` tag, a label with a newline — makes the whole message plain text, where every
value is exact and nothing can mention anyone. No look-alike characters are ever substituted.
Size (a digest): the longest fields are cut first, every field to one length (each cut field ends with a
marker saying how much), down to DIGEST_MIN_CHARS; then as many whole alerts as fit stay, in order (firing
first), and the others are left out; a last line always says how many alerts were shortened and how many left
out, with the Alertmanager link. Only when not even one alert fits, the first alert is shown with short fields
and the others in one line each (status and identity), still counted. Lines are never cut in half.
Several groups in one message (a backlog held back by the 20-a-minute rate): one line per group
(common.digest_lines), as many as fit, the groups that do not fit counted by name in a last line.
"""

from __future__ import annotations

import functools
import re
from typing import Any

from inferwatch.notifier.channels.base import DeliveryResult, HttpChannel, redact, reveal, too_long
from inferwatch.notifier.channels.common import (
    DIGEST_MORE_NAMES,
    DIGEST_VALUE_CHARS,
    AlertView,
    DigestLine,
    GroupView,
    coalesced_title,
    counts_by_name,
    digest_lines,
    group_view,
    is_http_url,
    omitted_names,
    title_parts,
)
from inferwatch.notifier.channels.template import WECOM_MARKERS, Line, Run, cut_run, plain, template_lines
from inferwatch.notifier.channels.text import MIN_FIELD_CHARS, fit_field_cap, fit_lines, utf8_len
from inferwatch.notifier.model import Notification
from inferwatch.spec import Channel as ChannelSpec

MARKDOWN_MAX_BYTES = 4096
TEXT_MAX_BYTES = 2048
FIELD_MAX_CHARS = 600         # one description or annotation, at most
DIGEST_MIN_CHARS = 120        # a field cut shorter says little: below this, alerts are left out instead
TITLE_VALUE_MAX_CHARS = 200   # a label value in the title or the key labels line
ERRCODE_TOO_LONG = 40058
ERRCODE_RATE_LIMITED = 45009
ERRCODE_BAD_KEY = (93000, 40008)   # invalid webhook url / invalid message type
ERRCODE_BUSY = -1                  # "system busy": retry
DEFAULT_ALERT_TEMPLATE = "**${summary}**\n${description}"
COLOR = {"firing": "warning", "resolved": "info"}
SEP = " · "

# Characters a markdown renderer may interpret anywhere in a line (emphasis, links, code, HTML, entities,
# escapes, headings, quotes, tables, strike-through).
MD_SPECIAL = frozenset("*_`[]()<>#~|\\&")
_CONTROL = re.compile(r"[\x00-\x1f\x7f\x85\u2028\u2029]")
_LIST_START = re.compile(r"^(?:[-+=]|\d+[.)])")
_MOBILE = re.compile(r"^\+?\d{6,15}$")


class NotLiteral(Exception):
    """A value that markdown cannot show exactly: the message goes out as plain text."""


def md_literal(value: str) -> str:
    """`value` as markdown that displays exactly `value`: as it is, or as an inline code span. Raises
    NotLiteral when neither is safe (see the module docstring)."""
    if not value:
        return ""
    edge_space = value != value.strip()
    if not edge_space and not _CONTROL.search(value) and not MD_SPECIAL.intersection(value) \
            and not _LIST_START.match(value):
        return value
    if _code_safe(value):
        return f"`{value}`"
    raise NotLiteral(value[:40])


def _code_safe(value: str) -> bool:
    return bool(value) and value == value.strip() and not _CONTROL.search(value) \
        and not set("`<&").intersection(value)


def md_value(value: str) -> str:
    """A multi-line value (a description) line by line: each line literal on its own."""
    return "\n".join(md_literal(line) for line in value.split("\n"))


def _link(text: str, url: str) -> str:
    if set("()<>`\\").intersection(url):
        raise NotLiteral(url[:40])
    return f"[{text}]({url})"


class _Markdown:
    """How the message is written: WeCom markdown (values literal or in code spans)."""

    markdown = True
    max_bytes = MARKDOWN_MAX_BYTES

    def runs(self, line: Line, multiline: bool = True) -> str:
        """Template runs as markdown: template text as written (it is the operator's markdown), each value
        literal (see md_literal) inside the emphasis the template put around it."""
        out = []
        for i, run in enumerate(line):
            if not run.value:
                out.append(self._emphasis(run.text, run.styles) if "marker" not in run.styles else run.text)
                continue
            text = run.text
            if i + 1 < len(line) and "marker" in line[i + 1].styles:
                text = text.rstrip()  # a cut value may end in a space, which a code span would lose
            if "code" in run.styles:  # the template put the value in a code span: it must be code-safe
                if text and not _code_safe(text):
                    raise NotLiteral(text[:40])
                out.append(f"`{text}`" if text else "")
                continue
            if "\n" in text and not multiline:
                raise NotLiteral(text[:40])
            out.append(self._emphasis(md_value(text), run.styles))
        return "".join(out)

    @staticmethod
    def _emphasis(text: str, styles) -> str:
        for style, mark in (("bold", "**"), ("italic", "*"), ("code", "`")):
            if style in styles:
                text = "\n".join(f"{mark}{line}{mark}" if line else "" for line in text.split("\n"))
        return text

    def value(self, text: str) -> str:
        """A value on a line of our own (a label): single-line literal."""
        return md_literal(text)

    def title(self, text: str, status: str) -> str:
        return f'## <font color="{COLOR.get(status, "comment")}">{text}</font>'

    def status(self, status: str) -> str:
        return f'<font color="{COLOR.get(status, "comment")}">{status.upper()}</font>'

    def quote(self, text: str) -> str:
        return f"> {text}"

    def links(self, links: list[tuple[str, str]]) -> str:
        return " ".join(_link(t, u) for t, u in links)

    def more(self, k: int, am: str) -> str:
        return f"…and {k} more" + (f" — {_link('Alertmanager', am)}" if am else "")


class _Text(_Markdown):
    """How the message is written: plain text (every value exactly as it is)."""

    markdown = False
    max_bytes = TEXT_MAX_BYTES

    def runs(self, line: Line, multiline: bool = True) -> str:
        return plain(line)

    def value(self, text: str) -> str:
        return text

    def title(self, text: str, status: str) -> str:
        return text

    def status(self, status: str) -> str:
        return status.upper()

    def quote(self, text: str) -> str:
        return text

    def links(self, links: list[tuple[str, str]]) -> str:
        return "  ".join(f"{t}: {u}" for t, u in links)

    def more(self, k: int, am: str) -> str:
        return f"…and {k} more" + (f", see Alertmanager: {am}" if am else "")


class WeComChannel(HttpChannel):
    kind = "wecom"
    rate_per_minute = 20       # "每个机器人发送的消息不能超过20条/分钟" (robot documentation)
    size_unit = "bytes"

    def __init__(self, name: str, spec: ChannelSpec):
        super().__init__(name, spec)
        self.template = spec.template or DEFAULT_ALERT_TEMPLATE

    # ------------------------------------------------------------------------------------ rendering
    def build_body(self, n: Notification) -> dict:
        """The request body: markdown when every value can be shown exactly in it, else text."""
        try:
            content = self._content(n, _Markdown())
            body: dict[str, Any] = {"msgtype": "markdown", "markdown": {"content": content}}
        except NotLiteral:
            content = self._content(n, _Text())
            body = {"msgtype": "text", "text": {"content": content}}
            users = [m for m in self.spec.mentions if not _MOBILE.match(m)]
            mobiles = [m for m in self.spec.mentions if _MOBILE.match(m)]
            if users:
                body["text"]["mentioned_list"] = users
            if mobiles:
                body["text"]["mentioned_mobile_list"] = mobiles
        self.last_size = utf8_len(content)
        return body

    def _content(self, n: Notification, fmt: _Markdown) -> str:
        tail = " ".join(f"<@{m}>" for m in self.spec.mentions) if fmt.markdown else ""
        budget = self.budget(fmt.max_bytes, n) - (utf8_len(tail) + 1 if tail else 0)
        first = n.groups[0]
        am = first.external_url if is_http_url(first.external_url) else ""
        if n.coalesced:
            body = self._coalesced(n, fmt, budget, am)
        else:
            view = group_view(first, self.template)
            head = self._head(n, view, fmt)
            body = self._digest(view, fmt, head, budget, am) or self._compact(view, fmt, head, budget, am)
        return body + ("\n" + tail if tail else "")

    def _digest(self, view: GroupView, fmt: _Markdown, head: str, budget: int, am: str) -> str | None:
        """Head, the first k alerts whole (every field cut to one length, at least DIGEST_MIN_CHARS), the
        others in one line each when they all fit (else left out), the alerts Alertmanager left out, and a
        line counting the alerts shortened, in one line and left out; k as large as fits `budget` bytes,
        then the length as large as fits. None when not even one alert fits whole."""
        alerts = view.alerts
        blocks: dict[int, list[str]] = {}
        lines = [self._line(view, a, fmt) for a in alerts]

        def blocks_at(cap: int) -> list[str]:
            if cap not in blocks:
                blocks[cap] = [self._alert_block(a, fmt, cap) for a in alerts]
            return blocks[cap]

        def render(k: int, cap: int, listing: bool) -> tuple[str, int]:
            shown = blocks_at(cap)[:k]
            # An alert is shortened when a field of it is cut at this length (its block differs from the uncut one).
            shortened = sum(1 for a, b in zip(blocks_at(10**9)[:k], shown, strict=True) if a != b)
            listed = lines[k:] if listing else []
            note = self._digest_note(len(alerts), k, shortened, fmt, am, listed=len(listed))
            text = "\n".join([head, *shown, *listed, *self._notes(view, fmt, am), *([note] if note else [])])
            return text, utf8_len(text)

        whole = fit_field_cap(lambda cap: render(len(alerts), cap, False), budget, FIELD_MAX_CHARS, DIGEST_MIN_CHARS)
        if whole is not None:
            return whole
        # The others named in one line each when they all fit beside the whole ones, else only counted.
        for listing in (True, False):
            lo, hi = 0, len(alerts) - 1  # lo fits (0: vacuously), hi is the most that may
            while lo < hi:
                mid = (lo + hi + 1) // 2
                if render(mid, DIGEST_MIN_CHARS, listing)[1] <= budget:
                    lo = mid
                else:
                    hi = mid - 1
            if lo:
                return fit_field_cap(functools.partial(render, lo, listing=listing), budget,
                                     FIELD_MAX_CHARS, DIGEST_MIN_CHARS)
        return None

    def _line(self, view: GroupView, a: AlertView, fmt: _Markdown) -> str:
        """An alert in one line: its status, its name when it is not the group's, its identity labels."""
        parts = [fmt.status(a.status)]
        if a.name != view.group.common_labels.get("alertname") or not a.identity:
            parts.append(self._cut(a.name or "(no alertname)", fmt, MIN_FIELD_CHARS))
        if a.identity:
            parts.append(self._pairs(a.identity, fmt, MIN_FIELD_CHARS, " "))
        return " ".join(parts)

    @staticmethod
    def _digest_note(total: int, shown: int, shortened: int, fmt: _Markdown, am: str, listed: int = 0) -> str:
        """`…and 11 more left out to fit 4,096 bytes; 3 of the 7 shown shortened (cut fields end in "…[cut")`
        with the Alertmanager link; '' when every alert is there whole. `listed`: alerts shown in one line
        each (status and labels, without their texts)."""
        left = total - shown - listed
        parts = []
        if left:
            parts.append(f"…and {left} more left out to fit {fmt.max_bytes:,} bytes")
        if listed:
            parts.append(f"{listed} in one line each, without summary and description")
        if shortened:
            parts.append(f"{shortened} of the {shown} shown shortened (cut fields end in \"…[cut\")")
        if not parts:
            return ""
        text = "; ".join(parts)
        if am and (left or listed):
            text += (" — " + _link("Alertmanager", am)) if fmt.markdown else f", see Alertmanager: {am}"
        return text

    def _head(self, n: Notification, view: GroupView, fmt: _Markdown) -> str:
        group = view.group
        lines = [fmt.title(("[ESCALATED] " if n.escalated else "") + self._title(group, fmt), group.status)]
        if view.key_labels:
            lines.append(fmt.quote(SEP.join(f"{fmt.value(k)}: {self._cut(v, fmt, TITLE_VALUE_MAX_CHARS)}"
                                            for k, v in view.key_labels)))
        if view.details:
            # Shared details are short label values; cut them so that they cannot crowd out the alerts.
            lines.append(fmt.quote("Details: " + self._pairs(view.details, fmt, 200)))
        if n.enrichment:
            lines.append(fmt.quote("Triage: " + self._cut(n.enrichment, fmt, 400)))
        return "\n".join(lines)

    def _title(self, group, fmt: _Markdown) -> str:
        """The title with its values literal, each cut to TITLE_VALUE_MAX_CHARS."""
        return "".join(self._cut(t, fmt, TITLE_VALUE_MAX_CHARS) if v else t for t, v in title_parts(group))

    def _pairs(self, pairs: list[tuple[str, str]], fmt: _Markdown, cap: int, sep: str = SEP) -> str:
        """`k=v` pairs on one line; keys too go through the literal rule (`custom_note` has underscores)."""
        return sep.join(f"{fmt.value(k)}={self._cut(v, fmt, cap)}" for k, v in pairs)

    def _cut(self, value: str, fmt: _Markdown, cap: int) -> str:
        """A label or annotation value on one line, cut to `cap` characters."""
        return fmt.runs(cut_run(Run(value, True), cap), multiline=False)

    def _alert_block(self, alert: AlertView, fmt: _Markdown, cap: int) -> str:
        lines = [fmt.runs(line) for line in template_lines(self.template, alert.fields, WECOM_MARKERS, cap)]
        status = fmt.status(alert.status)
        lines = [f"{status} {lines[0]}" if lines else status] + lines[1:]
        if alert.identity:
            lines.append(self._pairs(alert.identity, fmt, cap))
        if alert.details:
            lines.append("Details: " + self._pairs(alert.details, fmt, cap))
        if alert.links:
            lines.append(fmt.links(alert.links))
        return "\n".join(lines)

    def _notes(self, view: GroupView, fmt: _Markdown, am: str) -> list[str]:
        t = view.group.truncated_alerts
        if not t:
            return []
        return [f"{t} more alert(s) not included by Alertmanager" + (f", see {fmt.links([('Alertmanager', am)])}"
                                                                     if am else "")]

    def _compact(self, view: GroupView, fmt: _Markdown, head: str, budget: int, am: str) -> str:
        """The first alert with short fields, if it fits in half the budget, and every other alert in one
        line (status, its name when it is not the group's, identity labels), as many as fit; the rest
        counted."""
        lines = [self._line(view, a, fmt) for a in view.alerts]
        shortened = 0
        for cap in (300, 120, MIN_FIELD_CHARS):
            first = self._alert_block(view.first, fmt, cap)
            if utf8_len(head) + utf8_len(first) <= budget // 2:
                shortened = int(first != self._alert_block(view.first, fmt, 10**9))
                head, lines = head + "\n" + first, lines[1:]
                break
        shown = len(view.alerts) - len(lines)
        # Room for the counting line at its longest, so that it is never the line left out.
        longest = self._digest_note(len(view.alerts), shown, shortened, fmt, am, listed=len(lines))
        notes = self._notes(view, fmt, am)
        text, omitted = fit_lines(head, lines + notes, budget - utf8_len(longest) - 1,
                                  lambda k: fmt.more(k, am), measure=utf8_len)
        listed = len(lines) - max(0, omitted - len(notes))
        # The "…and N more" line fit_lines wrote counts what it left out; the note counts the one-line alerts.
        note = self._digest_note(shown + listed, shown, shortened, fmt, "", listed=listed)
        return text + ("\n" + note if note else "")

    def _coalesced(self, n: Notification, fmt: _Markdown, budget: int, am: str) -> str:
        """Title, alerts counted by name (within a quarter of `budget`), one line per group (see
        common.digest_lines) as many as fit `budget` bytes, then a line counting the groups left out by name
        with the Alertmanager link. Whole lines only."""
        status = n.status
        title = coalesced_title(n)
        head = f'## <font color="{COLOR[status]}">{title}</font>' if fmt.markdown else title
        counts = [fmt.quote(f"{fmt.value(name)} ({st}): {c}") for name, st, c in counts_by_name(n)]
        head, _ = fit_lines(head, counts, max(utf8_len(head) + 200, budget // 4),
                            lambda k: fmt.quote(f"…and {k} more name(s)"), measure=utf8_len)
        lines = digest_lines(n)
        used: list[int] = []  # bytes after each group line
        total = utf8_len(head)
        for line in lines:  # rendering stops at the first line that does not fit
            total += 1 + utf8_len(self._digest_line(line, fmt))
            if total > budget:
                break
            used.append(total)
        shown = len(used)
        more = None
        while shown < len(lines):
            before = used[shown - 1] if shown else utf8_len(head)
            # Every name counted, at the cost of a few lines; fewer names only when no line is left.
            more = self._more_groups(lines[shown:], fmt, am, budget - before - 1, all_names=shown > 0)
            if more is not None or shown == 0:
                break
            shown -= 1
        out = [head, *(self._digest_line(x, fmt) for x in lines[:shown])]
        if shown < len(lines):
            out.append(more or fmt.more(len(lines) - shown, am))
        return "\n".join(out)

    def _digest_line(self, line: DigestLine, fmt: _Markdown) -> str:
        """`[FIRING:1] GpuXidError · critical · node=node-a gpu=3 · [Runbook](url)`, values literal (see
        md_literal), each cut to DIGEST_VALUE_CHARS."""
        title = f"{line.tag} {self._cut(line.name or '(no alertname)', fmt, DIGEST_VALUE_CHARS)}"
        parts = [f'<font color="{COLOR.get(line.status, "comment")}">{title}</font>' if fmt.markdown else title]
        if line.severity:
            parts.append(self._cut(line.severity, fmt, DIGEST_VALUE_CHARS))
        if line.labels:
            parts.append(self._pairs(line.labels, fmt, DIGEST_VALUE_CHARS, " ")
                         + (f" (+{line.more_labels} label(s))" if line.more_labels else ""))
        text = SEP.join(parts) + (f" — {line.counts}" if line.counts else "")
        return text + (SEP + fmt.links([("Runbook", line.runbook)]) if line.runbook else "")

    def _more_groups(self, omitted: list[DigestLine], fmt: _Markdown, am: str, room: int,
                     all_names: bool = False) -> str | None:
        """`…and 12 more group(s) not shown: 10 × GpuXidError (firing), 2 × TritonServerDown (resolved) — see
        Alertmanager`, naming as many of the DIGEST_MORE_NAMES most frequent names as fit `room` bytes (the
        others counted as names; with `all_names`, all of those or None); None when not even the count fits."""
        names = omitted_names(omitted)
        link = ((" — " + _link("Alertmanager", am)) if fmt.markdown else f", see Alertmanager: {am}") if am \
            else " — see Alertmanager"
        most = min(DIGEST_MORE_NAMES, len(names))
        for keep in range(most, most - 1 if all_names else -1, -1):
            named = [f"{c} × {self._cut(name or '(no alertname)', fmt, DIGEST_VALUE_CHARS)} ({status})"
                     for name, status, c in names[:keep]]
            if len(names) > keep:
                named.append(f"{len(names) - keep} other name(s)")
            text = f"…and {len(omitted)} more group(s) not shown: " + ", ".join(named) + link
            if utf8_len(text) <= room:
                return text
        return None

    # ------------------------------------------------------------------------------------ sending
    def deliver(self, notification: Notification) -> DeliveryResult:
        url = reveal(self.spec.url)
        resp, result = self.post(url, self.build_body(notification), secrets=[url])
        if resp is None or not result.ok:
            return result
        # WeCom answers HTTP 200 for everything; the outcome is in errcode.
        try:
            answer = resp.json()
            errcode = int(answer.get("errcode", -2))
            errmsg = redact(str(answer.get("errmsg", ""))[:200], [url])
        except (ValueError, AttributeError, TypeError):
            return DeliveryResult.fail("provider_error", "HTTP 200 without a JSON errcode", retryable=True)
        if errcode == 0:
            return DeliveryResult.success("errcode 0")
        detail = f"errcode {errcode} {errmsg}"
        if errcode == ERRCODE_TOO_LONG:
            return too_long(DeliveryResult.fail("invalid_payload", detail, retryable=False))
        if errcode == ERRCODE_RATE_LIMITED:
            return DeliveryResult.fail("rate_limited", detail, retryable=True, retry_after=60.0)
        if errcode in ERRCODE_BAD_KEY:
            return DeliveryResult.fail("bad_key", detail, retryable=False)
        if errcode == ERRCODE_BUSY:
            return DeliveryResult.fail("provider_error", detail, retryable=True)
        return DeliveryResult.fail("provider_error", detail, retryable=False)
