"""Incremental Server-Sent Events splitter: bytes in, complete events' data out.

A network read may hold several events or part of one (genai-perf notes both), so events are cut on the
blank line that ends them, following WHATWG HTML §9.2 "Server-sent events" (event stream interpretation):
- a line ends in CRLF, LF or a lone CR. A CR is a line end *at once*: when a read ends in CR the event is
  released now, and an LF that starts the next read is skipped as the second half of a CRLF. (Holding the
  CR back until the next read, as httpx-sse's line decoder does, releases every `\\r\\r`-framed event one
  read late and loses the last one.)
- `data:` lines of one event join with LF; one space after the colon is dropped; a line that starts with
  `:` is a comment (keep-alive); a leading UTF-8 BOM is ignored; `event: error` names an error event.
- a partial event at the end of the stream is discarded, as the specification tells a client to.

Why not a library: httpx-sse (the most used) holds the CR back as above, works on text only and keeps its
decoder private; sseclient-py pulls from a blocking iterator and yields a trailing partial event;
aiohttp-sse-client owns the HTTP connection. The proxy needs a push-style parser of a copy of the bytes it
forwards, so this splitter is the project's own, tested against the specification's line-end forms.
The common case, one `data: …` line per event with LF endings, is handled without splitting lines.
"""

from __future__ import annotations

_BOM = b"\xef\xbb\xbf"


class ErrorEvent(bytes):
    """The data of an event named `error` (`event: error`): the OpenAI SDK treats it as a failed stream."""


class EventTooLarge(Exception):
    """An event grew past the splitter's limit without ending (it is not parsed; the stream goes on)."""


class SseSplitter:
    """`feed(chunk)` returns the data of each event completed by `chunk`; comment-only events are dropped,
    an event whose data is empty gives b"". `limit` bounds the bytes held for one unfinished event:
    `feed` raises EventTooLarge beyond it."""

    __slots__ = ("_buf", "_after_cr", "_started", "limit")

    def __init__(self, limit: int | None = None) -> None:
        self._buf = b""
        self._after_cr = False
        self._started = False
        self.limit = limit

    def feed(self, chunk: bytes) -> list[bytes]:
        # The usual read: exactly one whole event of one `data: ` line with LF endings and nothing held from
        # before (a streamed token). Cut out its data without the general loop: this runs once per event.
        if (not self._buf and self._started and not self._after_cr and chunk[:6] == b"data: "
                and chunk.find(b"\n") == len(chunk) - 2 and chunk[-1:] == b"\n" and b"\r" not in chunk):
            return [chunk[6:-2]]
        if self._after_cr:
            self._after_cr = False
            if chunk[:1] == b"\n":
                chunk = chunk[1:]  # the LF of a CRLF that was split between two reads
        if not self._started and chunk:
            self._started = True
            if chunk.startswith(_BOM):
                chunk = chunk[3:]
        buf = self._buf + chunk if self._buf else bytes(chunk)
        if b"\r" in buf:
            # _buf never holds a CR (it was normalised when it arrived), so only this read's are rewritten.
            self._after_cr = buf.endswith(b"\r")
            buf = buf.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        out: list[bytes] = []
        start = 0
        find = buf.find
        while True:
            end = find(b"\n\n", start)
            if end < 0:
                break
            event = buf[start:end]
            start = end + 2
            if event.startswith(b"data:") and b"\n" not in event:
                data = event[5:]
                out.append(data[1:] if data[:1] == b" " else data)
            elif event:
                slow = _slow_event(event)
                if slow is not None:
                    out.append(slow)
        self._buf = buf[start:] if start < len(buf) else b""
        if self.limit is not None and len(self._buf) > self.limit:
            self._buf = b""
            raise EventTooLarge(f"an event above {self.limit} bytes")
        return out


def _slow_event(event: bytes) -> bytes | None:
    parts = []
    name = b""
    for line in event.split(b"\n"):
        if line.startswith(b":") or not line:
            continue
        field, _, value = line.partition(b":")
        if value[:1] == b" ":
            value = value[1:]
        if field == b"data":
            parts.append(value)
        elif field == b"event":
            name = value
    if not parts:
        return None
    data = b"\n".join(parts)
    return ErrorEvent(data) if name == b"error" else data
