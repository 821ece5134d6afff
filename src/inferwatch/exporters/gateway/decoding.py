"""Content-Encoding decoders for the copy of a response the gateway meters (the client gets the bytes as sent).

Clients that send `Accept-Encoding` (browsers, `curl --compressed`, most HTTP libraries) get compressed
answers from upstreams and ingresses. The proxy forwards those bytes untouched and decodes a copy to read
tokens. Supported (RFC 9110 §8.4.1, RFC 7932, RFC 8878): `gzip` / `x-gzip` and `deflate` through zlib
(`deflate` is the zlib format; raw DEFLATE, which some servers send, is accepted too), `br` through Google's
`brotli`, `zstd` through `backports.zstd` (Python 3.14's `compression.zstd`); `identity` is a no-op. A list
(`gzip, br`) is undone last-applied first. Concatenated gzip members and zstd frames are decoded in turn.

Every decoder takes `max_out`, the most decoded bytes one `feed` may produce: a small compressed input can
expand a thousandfold, so output is bounded before it is allocated in full.
"""

from __future__ import annotations

import sys
import zlib
from typing import Any

import brotli

if sys.version_info >= (3, 14):
    from compression.zstd import ZstdDecompressor, ZstdError
else:
    from backports.zstd import ZstdDecompressor, ZstdError


class Undecodable(Exception):
    """An encoding the gateway does not know, or bytes that do not decode under the declared one."""


class TooLarge(Exception):
    """The decoded output passed `max_out`."""


class _Members:
    """A decoder for formats whose stream may hold several members (gzip members, zstd frames): each member
    needs a fresh decompressor, which takes the previous one's `unused_data`."""

    __slots__ = ("_d",)
    _d: Any  # the stdlib decompressor of the format (zlib, zstd): no common type

    def _new(self):
        raise NotImplementedError

    def _more(self, d) -> bytes | None:
        """Input to feed `d` again (it stopped at the output limit), or None when it wants new input."""
        raise NotImplementedError

    def _decode(self, data: bytes, max_out: int) -> bytes:
        if self._d.eof:
            self._d = self._new()  # the previous read ended a member; this one starts the next
        out = []
        size = 0
        while True:
            part = self._d.decompress(data, max_out + 1 - size)
            out.append(part)
            size += len(part)
            if size > max_out:
                raise TooLarge
            if self._d.eof:
                data = self._d.unused_data
                if not data:
                    break
                self._d = self._new()
                continue
            more = self._more(self._d)
            if more is None:
                break
            data = more
        return b"".join(out)


class _Zlib(_Members):
    __slots__ = ("_wbits", "_first")

    def __init__(self, wbits: int):
        self._wbits = wbits
        self._d = self._new()
        self._first = b"" if wbits == zlib.MAX_WBITS else None  # deflate: the first bytes, until there are 2

    def _new(self):
        return zlib.decompressobj(self._wbits)

    def _more(self, d) -> bytes | None:
        return d.unconsumed_tail or None

    def feed(self, data: bytes, max_out: int) -> bytes:
        if self._first is not None:
            data = self._first + data
            if len(data) < 2:
                self._first = data
                return b""
            self._first = None
            # RFC 9110 says deflate is the zlib format, but some servers send raw DEFLATE: a zlib stream's
            # first two bytes name method 8 and are a multiple of 31 (RFC 1950 §2.2).
            if not _zlib_header(data):
                self._wbits = -zlib.MAX_WBITS
                self._d = self._new()
        try:
            return self._decode(data, max_out)
        except zlib.error as exc:
            raise Undecodable(str(exc)) from None


def _zlib_header(data: bytes) -> bool:
    return data[0] & 0x0F == 8 and (data[0] << 8 | data[1]) % 31 == 0


class _Brotli:
    __slots__ = ("_d",)

    def __init__(self):
        self._d = brotli.Decompressor()

    def feed(self, data: bytes, max_out: int) -> bytes:
        try:
            out = self._d.process(data, output_buffer_limit=max_out + 1)
        except brotli.error as exc:
            raise Undecodable(str(exc) or "brotli: corrupt input") from None
        if len(out) > max_out or not self._d.can_accept_more_data():
            raise TooLarge
        return out


class _Zstd(_Members):
    __slots__ = ()

    def __init__(self):
        self._d = self._new()

    def _new(self):
        return ZstdDecompressor()

    def _more(self, d) -> bytes | None:
        return None if d.needs_input else b""

    def feed(self, data: bytes, max_out: int) -> bytes:
        try:
            return self._decode(data, max_out)
        except ZstdError as exc:
            raise Undecodable(str(exc)) from None


_DECODERS = {"gzip": lambda: _Zlib(16 + zlib.MAX_WBITS), "x-gzip": lambda: _Zlib(16 + zlib.MAX_WBITS),
             "deflate": lambda: _Zlib(zlib.MAX_WBITS), "br": _Brotli, "zstd": _Zstd}


class Decoder:
    """Undoes a Content-Encoding list, incrementally. `feed(data, max_out)` returns the decoded bytes so far;
    raises Undecodable (bad bytes) or TooLarge (decoded output above `max_out` in this call)."""

    __slots__ = ("_chain",)

    def __init__(self, chain: list):
        self._chain = chain

    def feed(self, data: bytes, max_out: int) -> bytes:
        for decoder in self._chain:
            data = decoder.feed(data, max_out)
        return data


def decoder_for(content_encoding: str | None) -> Decoder | None:
    """A Decoder for a Content-Encoding header value, None when the body is not encoded.

    Raises Undecodable naming an encoding that is not supported (e.g. `compress`)."""
    if not content_encoding:
        return None
    names = [n.strip().lower() for n in content_encoding.split(",")]
    chain = []
    for name in reversed(names):
        if name in ("", "identity"):
            continue
        make = _DECODERS.get(name)
        if make is None:
            raise Undecodable(f"unsupported Content-Encoding {name[:40]!r}")
        chain.append(make())
    return Decoder(chain) if chain else None
