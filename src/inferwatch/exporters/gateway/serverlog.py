"""The gateway's aiohttp logger (its /metrics server): malformed requests are one INFO line, real errors stay
tracebacks.

aiohttp logs every request its parser refuses (a non-HTTP line, a request line or header above 8190 bytes)
with `logger.exception`, i.e. an ERROR with a full traceback, though the client already got its 400 and
nothing on the server failed. On a listening port such requests are routine (scanners, TLS to a plain port),
so they would bury real errors. Only aiohttp's parser errors (`http_exceptions.HttpProcessingError`, raised
for what the client sent) are shortened; any other exception (a handler bug) is logged unchanged.
"""

from __future__ import annotations

import logging
import sys

from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.log import server_logger

_MAX_DETAIL = 200  # characters of the parser's message kept: it may quote the client's (huge) request line


class ServerLog(logging.LoggerAdapter):
    """Pass as `logger=` to `web.AppRunner`; wraps aiohttp's own `aiohttp.server` logger by default."""

    def __init__(self, logger: logging.Logger = server_logger):
        super().__init__(logger, {})

    def log(self, level, msg, *args, exc_info=None, **kwargs) -> None:
        # aiohttp calls .exception (ERROR) or, for a non-HTTP first line, .debug with exc_info; both end here.
        exc = exc_info if isinstance(exc_info, BaseException) else sys.exc_info()[1] if exc_info else None
        if isinstance(exc, HttpProcessingError):
            # The parser's message spans lines (it quotes the request and marks the bad byte): fold it.
            detail = " ".join(str(exc.message).split())
            if len(detail) > _MAX_DETAIL:
                detail = detail[:_MAX_DETAIL] + "..."
            self.logger.log(min(level, logging.INFO), "%s: %d %s: %s", msg % args if args else msg, exc.code,
                            type(exc).__name__, detail)
            return
        self.logger.log(level, msg, *args, exc_info=exc_info, **kwargs)
