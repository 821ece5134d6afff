"""How the simulated chat providers read a message: what a person sees, who is mentioned, and whether
Slack would accept the blocks. A model of the providers' documented rules, for the simulators in
inferwatch/testing/channels.py; the tests check the notifier's messages against it.

Slack (api.slack.com formatting reference, Block Kit reference): `mrkdwn` text (section text and fields,
context elements, the top-level `text`) turns `<!channel>`, `<!here>`, `<!everyone>`, `<@U…>` and
`<!subteam^…>` into mentions and `<url|label>` into links, decodes `&amp;` `&lt;` `&gt;`, and formats
`*bold*`, `_italic_`, `~strike~` at word boundaries (not inside `` `code` ``). `plain_text` is shown as
written. `rich_text` elements are shown as written; mentions are only its `user`, `usergroup` and
`broadcast` elements.
WeCom robot (developer.work.weixin.qq.com/document/path/91770): markdown content mentions `<@userid>`,
renders `<font color=…>`, `**bold**`, `[label](url)` and `` `code` ``; text content is shown as written and
mentions only `mentioned_list` / `mentioned_mobile_list`.
"""

from __future__ import annotations

import re

# ------------------------------------------------------------------------------------------------ Slack
_SLACK_ANGLE = re.compile(r"<([^<>]*)>")
_SLACK_MENTION = re.compile(r"^(?:!channel|!here|!everyone|@[UW][A-Z0-9]+|!subteam\^[A-Z0-9]+)(?:\|[^>]*)?$")
_SLACK_FORMAT = [re.compile(r"(?<![\w*])\*(?=\S)([^*\n]+?)(?<=\S)\*(?![\w*])"),
                 re.compile(r"(?<![\w_])_(?=\S)([^_\n]+?)(?<=\S)_(?![\w_])"),
                 re.compile(r"(?<![\w~])~(?=\S)([^~\n]+?)(?<=\S)~(?![\w~])")]
_SLACK_CODE = re.compile(r"(`[^`\n]+`)")
RICH_CONTAINERS = ("rich_text_section", "rich_text_list", "rich_text_quote", "rich_text_preformatted")
RICH_LEAVES = ("text", "link", "emoji", "user", "usergroup", "broadcast", "channel", "date", "color")
RICH_STYLES = ("bold", "italic", "strike", "code", "underline")


def slack_mrkdwn_mentions(text: str) -> list[str]:
    return [m.group(1).split("|")[0] for m in _SLACK_ANGLE.finditer(text) if _SLACK_MENTION.match(m.group(1))]


def slack_mrkdwn_display(text: str) -> str:
    """What Slack shows for mrkdwn `text`: links and mentions as their labels, formatting markers removed
    outside code spans, entities decoded."""
    def angle(m: re.Match) -> str:
        target, _, label = m.group(1).partition("|")
        if label:
            return label
        if target.startswith(("!", "@")):
            return "@" + target.lstrip("!@").split("^")[-1]
        return target

    parts = _SLACK_CODE.split(_SLACK_ANGLE.sub(angle, text))
    for i in range(0, len(parts), 2):  # even parts are outside code spans
        for pattern in _SLACK_FORMAT:
            parts[i] = pattern.sub(r"\1", parts[i])
    return _unescape("".join(p[1:-1] if i % 2 else p for i, p in enumerate(parts)))


def _unescape(text: str) -> str:
    return text.replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")


def _text_object(obj: dict) -> tuple[str, list[str]]:
    """(display, mentions) of a Block Kit text object."""
    text = obj.get("text", "")
    if obj.get("type") == "mrkdwn":
        return slack_mrkdwn_display(text), slack_mrkdwn_mentions(text)
    return text, []


def _rich(elements: list) -> tuple[str, list[str]]:
    out, mentions = [], []
    for el in elements:
        kind = el.get("type")
        if kind in RICH_CONTAINERS:
            text, found = _rich(el.get("elements", []))
            out.append(text + ("\n" if kind in ("rich_text_list", "rich_text_quote", "rich_text_preformatted")
                               else ""))
            mentions += found
        elif kind == "text":
            out.append(el.get("text", ""))
        elif kind == "link":
            out.append(el.get("text") or el.get("url", ""))
        elif kind == "emoji":
            out.append(f":{el.get('name', '')}:")
        elif kind in ("user", "usergroup", "broadcast"):
            target = el.get("user_id") or el.get("usergroup_id") or el.get("range", "")
            out.append(f"@{target}")
            mentions.append(target)
        elif kind == "channel":
            out.append(f"#{el.get('channel_id', '')}")
    return "".join(out), mentions


def slack_block_display(block: dict) -> tuple[str, list[str]]:
    """(what a person sees, who is mentioned) for one block."""
    kind = block.get("type")
    if kind == "rich_text":
        return _rich(block.get("elements", []))
    parts, mentions = [], []
    if isinstance(block.get("text"), dict):
        text, found = _text_object(block["text"])
        parts.append(text)
        mentions += found
    for f in block.get("fields", []) + (block.get("elements", []) if kind == "context" else []):
        text, found = _text_object(f)
        parts.append(text)
        mentions += found
    if kind == "actions":
        parts += [f"[{e['text']['text']}]({e.get('url', '')})" for e in block.get("elements", []) if "text" in e]
    return "\n".join(parts), mentions


def slack_block_ok(block: dict) -> bool:
    """Whether Slack accepts `block` (types, required text objects, per-block limits)."""
    kind = block.get("type")
    if kind == "header":
        text = block.get("text") or {}
        return text.get("type") == "plain_text" and 0 < len(text.get("text", "")) <= 150
    if kind == "section":
        if "text" in block and len(block["text"].get("text", "")) > 3000:
            return False
        fields = block.get("fields", [])
        return ("text" in block or fields) and len(fields) <= 10 and all(len(f["text"]) <= 2000 for f in fields)
    if kind == "rich_text":
        return _rich_ok(block.get("elements"))
    if kind == "actions":
        return all(e.get("url", "").startswith(("http://", "https://")) for e in block.get("elements", []))
    return kind in ("context", "divider")


def _rich_ok(elements) -> bool:
    if not isinstance(elements, list) or not elements:
        return False
    for el in elements:
        kind = el.get("type") if isinstance(el, dict) else None
        if kind in RICH_CONTAINERS:
            if not _rich_ok(el.get("elements")):
                return False
        elif kind == "text":
            if not isinstance(el.get("text"), str) or not el["text"]:
                return False  # Slack: "must be more than 0 characters"
            if set(el.get("style", {})) - set(RICH_STYLES):
                return False
        elif kind == "link":
            if not str(el.get("url", "")).startswith(("http://", "https://")):
                return False
        elif kind not in RICH_LEAVES:
            return False
    return True


def slack_text_chars(node) -> int:
    """Characters of text in a block tree (every `text` string): what Slack's cumulative limit counts."""
    if isinstance(node, list):
        return sum(slack_text_chars(x) for x in node)
    if isinstance(node, dict):
        return sum(len(v) if k == "text" and isinstance(v, str) else slack_text_chars(v) for k, v in node.items())
    return 0


def slack_display(msg: dict) -> tuple[str, list[str]]:
    """(what a person sees, who is mentioned) for a whole message: blocks when present, else `text`."""
    mentions = slack_mrkdwn_mentions(msg.get("text", "")) if msg.get("mrkdwn", True) else []
    if not msg.get("blocks"):
        return slack_mrkdwn_display(msg.get("text", "")), mentions
    parts = []
    for block in msg["blocks"]:
        text, found = slack_block_display(block)
        parts.append(text)
        mentions += found
    return "\n".join(parts), mentions


# ------------------------------------------------------------------------------------------------ WeCom
_WECOM_MENTION = re.compile(r"<@([^<>]+)>")
_WECOM_FONT = re.compile(r'</?font(?: color="[a-z]+")?>')
_WECOM_LINK = re.compile(r"\[([^\[\]]*)\]\(([^()\s]*)\)")
_WECOM_CODE = re.compile(r"(`[^`\n]*`)")


def wecom_display(msg: dict) -> tuple[str, list[str]]:
    """(what a person sees, who is mentioned) for a robot message (markdown or text)."""
    if msg.get("msgtype") == "text":
        text = msg["text"]
        return text.get("content", ""), list(text.get("mentioned_list", [])) + \
            list(text.get("mentioned_mobile_list", []))
    content = msg["markdown"]["content"]
    mentions = _WECOM_MENTION.findall(content)
    parts = _WECOM_CODE.split(content)
    for i in range(0, len(parts), 2):  # outside code spans
        p = _WECOM_FONT.sub("", parts[i])
        p = _WECOM_LINK.sub(r"\1", p)
        p = p.replace("**", "")
        p = re.sub(r"(?m)^(?:#{1,6} |> ?)", "", p)
        parts[i] = p
    return "".join(p[1:-1] if i % 2 else p for i, p in enumerate(parts)), mentions
