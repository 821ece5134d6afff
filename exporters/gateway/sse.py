"""Incremental Server-Sent Events splitter: bytes in, complete events' data out.

A network read may hold several events or part of one (genai-perf notes both), so events are cut on the
blank line that ends them (WHATWG HTML §9.2 "Server-sent events": lines end in CRLF, LF or CR; `data:` lines
of one event join with LF; lines starting with `:` are comments, e.g. keep-alives). The common case, one
`data: …` line per event with LF endings, is handled without splitting lines.
"""

from __future__ import annotations


class SseSplitter:
    """`feed(chunk)` returns the data of each event completed by `chunk`; comment-only events are dropped,
    an event whose data is empty gives b"". A partial event at the end of the stream is discarded (as the
    SSE specification says a client must)."""

    __slots__ = ("_buf",)

    def __init__(self) -> None:
        self._buf = b""

    def feed(self, chunk: bytes) -> list[bytes]:
        buf = self._buf + chunk if self._buf else bytes(chunk)
        if b"\r" in buf:
            # A CR at the very end may be the first half of a CRLF: keep it for the next read.
            hold = buf.endswith(b"\r")
            body = buf[:-1] if hold else buf
            buf = body.replace(b"\r\n", b"\n").replace(b"\r", b"\n") + (b"\r" if hold else b"")
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
                data = _slow_event(event)
                if data is not None:
                    out.append(data)
        self._buf = buf[start:] if start < len(buf) else b""
        return out


def _slow_event(event: bytes) -> bytes | None:
    parts = []
    for line in event.split(b"\n"):
        if line.startswith(b":") or not line:
            continue
        name, _, value = line.partition(b":")
        if name == b"data":
            parts.append(value[1:] if value[:1] == b" " else value)
    return b"\n".join(parts) if parts else None
