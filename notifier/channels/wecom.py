"""WeCom (企业微信) group robot: markdown ≤ 4096 UTF-8 bytes, label values escaped, optional @mentions.

Facts (research/alerting.md §5.3, https://developer.work.weixin.qq.com/document/path/91770): POST
`.../cgi-bin/webhook/send?key=KEY` with `{"msgtype":"markdown","markdown":{"content":...}}`; every answer is
HTTP 200 with `errcode` (0 ok, 40058 content too long, 45009 rate limited, 93000 invalid webhook key);
20 messages per minute per robot. Chinese text counts 3 bytes a character, so the budget is in bytes and
truncation drops whole lines ("…and N more" plus an Alertmanager link), never half a character or link.
"""

from __future__ import annotations

from inferwatch.notifier.channels.base import (DeliveryResult, fit_lines, post_json, redact, truncate_bytes,
                                               utf8_len)
from inferwatch.notifier.channels.common import (alert_fields, coalesced_title, counts_by_name, group_title,
                                                 is_http_url, key_labels, render_template)
from inferwatch.notifier.model import Notification
from inferwatch.spec import Channel as ChannelSpec

MARKDOWN_MAX_BYTES = 4096
RATE_PER_MINUTE = 20
DESCRIPTION_MAX_BYTES = 600   # one alert's text, so that one noisy alert cannot crowd out the others
ERRCODE_TOO_LONG = 40058
ERRCODE_RATE_LIMITED = 45009
ERRCODE_BAD_KEY = (93000, 40008)   # invalid webhook url / invalid message type
ERRCODE_BUSY = -1                  # "system busy": retry
DEFAULT_ALERT_TEMPLATE = "**${summary}**\n${description}"
COLOR = {"firing": "warning", "resolved": "info"}

# Characters WeCom markdown interprets inside a line; label values get look-alikes so a value such as
# `<font color="info">` or `[x](http://evil)` cannot change the message. Backslash escapes are not
# reliably honoured by WeCom, and over-escaping breaks URLs (research §6, issue 11), so links are
# built by us and never pass through this.
_ESCAPES = str.maketrans({"<": "＜", ">": "＞", "[": "［", "]": "］", "`": "'", "*": "∗", "\n": " ", "\r": " "})


def escape(text: str) -> str:
    return text.translate(_ESCAPES)


class WeComChannel:
    kind = "wecom"

    def __init__(self, name: str, spec: ChannelSpec):
        self.name = name
        self.spec = spec
        self.template = spec.template or DEFAULT_ALERT_TEMPLATE

    def _mentions(self) -> str:
        # Markdown messages take mentions inline as <@userid> (mentioned_list is for text messages only).
        return " ".join(f"<@{escape(m)}>" for m in self.spec.mentions)

    def _alert_block(self, alert, group) -> str:
        fields = {k: escape(v) for k, v in alert_fields(alert, group).items()}
        fields["description"] = truncate_bytes(fields["description"], DESCRIPTION_MAX_BYTES)
        fields["summary"] = truncate_bytes(fields["summary"], DESCRIPTION_MAX_BYTES // 2)
        text = truncate_bytes(render_template(self.template, fields), DESCRIPTION_MAX_BYTES * 2)
        labels = " · ".join(f"{k}: {escape(v)}" for k, v in key_labels(alert.labels) if k not in ("layer",))
        links = [f"[{t}]({u})" for t, u in (("Runbook", fields["runbook_url"]),
                                            ("Prometheus", alert.generator_url)) if is_http_url(u)]
        mark = f'<font color="{COLOR.get(alert.status, "comment")}">{alert.status}</font>'
        return "\n".join(p for p in (f"> {mark} {truncate_bytes(labels, 300)}", text, " ".join(links)) if p)

    def build_markdown(self, n: Notification) -> str:
        budget = int(MARKDOWN_MAX_BYTES * n.budget_factor)
        tail = "\n".join(p for p in (self._mentions(),) if p)
        first = n.groups[0]
        am = first.external_url if is_http_url(first.external_url) else ""

        def more(k: int) -> str:
            return f"…and {k} more" + (f" — [Alertmanager]({am})" if am else "")

        if n.coalesced:
            head = f'## <font color="{COLOR[n.status]}">{coalesced_title(n)}</font>'
            counts = [f"> {escape(name)} ({status}): {c}" for name, status, c in counts_by_name(n)]
            lines = counts + [group_title(g, escape) for g in n.groups]
        else:
            title = group_title(first, escape)
            if n.escalated:
                title = "[ESCALATED] " + title
            head = f'## <font color="{COLOR[first.status]}">{title}</font>'
            shown = first.firing if first.status == "firing" and first.firing else list(first.alerts)
            lines = [self._alert_block(a, first) for a in shown]
            if n.enrichment:
                head += "\n> Triage: " + escape(truncate_bytes(n.enrichment, 400))
            if first.truncated_alerts:
                lines.append(more(first.truncated_alerts))
        room = budget - (utf8_len(tail) + 1 if tail else 0)
        body, _ = fit_lines(head, lines, room, more, measure=utf8_len)
        return body + ("\n" + tail if tail else "")

    def send(self, notification: Notification) -> DeliveryResult:
        try:
            url = self.spec.url.reveal()
        except Exception as exc:
            return DeliveryResult.fail("secret_missing", str(exc), retryable=True)
        body = {"msgtype": "markdown", "markdown": {"content": self.build_markdown(notification)}}
        resp, result = post_json(url, body, timeout=self.spec.timeout.seconds, secrets=[url])
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
            return DeliveryResult.fail("too_long", detail, retryable=True)
        if errcode == ERRCODE_RATE_LIMITED:
            return DeliveryResult.fail("rate_limited", detail, retryable=True, retry_after=60.0)
        if errcode in ERRCODE_BAD_KEY:
            return DeliveryResult.fail("bad_key", detail, retryable=False)
        if errcode == ERRCODE_BUSY:
            return DeliveryResult.fail("provider_error", detail, retryable=True)
        return DeliveryResult.fail("provider_error", detail, retryable=False)
