"""One provider request within bounds: an overall deadline and at most MAX_ANSWER_BYTES of the answer read.

`requests`' timeouts bound each socket operation, not the request: an answer trickled one byte every 5 s
never trips a 10 s read timeout and held a send slot for minutes; and `Response.text` reads the whole answer
(a 1 GB error page took a send process to 2 GB). Here:

- the deadline covers connect, sending the request and reading the answer (head and body). Each socket
  operation gets at most the whole deadline as its own timeout, and a watchdog timer shuts the request's
  socket down when the deadline passes, which ends any read or write in progress at once. The connection
  is found through a urllib3 connection class of our own (registered per request, per thread), so a
  kept-alive connection reused from the pool is cut as well as a new one;
- the answer is read as a stream, at most MAX_ANSWER_BYTES (enough for any provider's error text); the rest
  is discarded with the connection. `Accept-Encoding: identity` asks for it uncompressed; a provider that
  compresses anyway is decoded by urllib3, whose streaming decoder bounds its output per read.
"""

from __future__ import annotations

import dataclasses
import json
import socket
import threading
from typing import Mapping

import requests
from requests.adapters import HTTPAdapter
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool

MAX_ANSWER_BYTES = 64 * 1024  # of a provider's answer body read; the rest is discarded unread
READ_CHUNK = 16 * 1024


class DeadlineExceeded(requests.Timeout):
    """The request did not complete (connect, send, whole answer) within its deadline."""


@dataclasses.dataclass(frozen=True)
class Answer:
    """A provider's answer: status, headers and the first MAX_ANSWER_BYTES of its body as text (UTF-8,
    undecodable bytes replaced); `cut` when more was discarded."""

    status_code: int
    headers: Mapping[str, str]
    text: str
    cut: bool = False

    def json(self):
        """The body as JSON; raises ValueError when it is not (or was cut)."""
        return json.loads(self.text)


class _Deadline:
    """The watchdog of one request: shuts down the socket of the connection in use when it fires."""

    def __init__(self, seconds: float):
        self.seconds = seconds
        self.expired = False
        self._done = False
        self._conn: HTTPConnection | None = None
        self._lock = threading.Lock()
        self._timer = threading.Timer(seconds, self._fire)
        self._timer.daemon = True

    def start(self) -> None:
        self._timer.start()

    def finish(self) -> None:
        with self._lock:
            self._done = True
        self._timer.cancel()

    def attach(self, conn: HTTPConnection) -> None:
        """`conn` carries this request now (called before each request on it and after it connects)."""
        with self._lock:
            self._conn = conn
            if self.expired and not self._done:
                _shutdown(conn)

    def _fire(self) -> None:
        with self._lock:
            if self._done:
                return
            self.expired = True
            if self._conn is not None:
                _shutdown(self._conn)


def _shutdown(conn: HTTPConnection) -> None:
    sock = getattr(conn, "sock", None)
    if sock is not None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass  # already closed


_current = threading.local()  # the _Deadline of the request this thread is making


class _Tracked:
    """Mixin for urllib3's connection classes: report the connection to the thread's deadline."""

    def connect(self):
        super().connect()
        deadline = getattr(_current, "deadline", None)
        if deadline is not None:
            deadline.attach(self)

    def request(self, *args, **kwargs):
        deadline = getattr(_current, "deadline", None)
        if deadline is not None:
            deadline.attach(self)
        return super().request(*args, **kwargs)


class _Connection(_Tracked, HTTPConnection):
    pass


class _HTTPSConnection(_Tracked, HTTPSConnection):
    pass


class _Pool(HTTPConnectionPool):
    ConnectionCls = _Connection


class _HTTPSPool(HTTPSConnectionPool):
    ConnectionCls = _HTTPSConnection


class DeadlineAdapter(HTTPAdapter):
    """requests' adapter whose pools make connections the deadline watchdog can find."""

    def init_poolmanager(self, *args, **kwargs):
        super().init_poolmanager(*args, **kwargs)
        self.poolmanager.pool_classes_by_scheme = {"http": _Pool, "https": _HTTPSPool}

    def proxy_manager_for(self, proxy, **proxy_kwargs):
        manager = super().proxy_manager_for(proxy, **proxy_kwargs)
        manager.pool_classes_by_scheme = {"http": _Pool, "https": _HTTPSPool}
        return manager


def bounded_session(user_agent: str) -> requests.Session:
    """A session for `post_within`: our adapter on http and https, the User-Agent, uncompressed answers."""
    session = requests.Session()
    session.mount("http://", DeadlineAdapter())
    session.mount("https://", DeadlineAdapter())
    session.headers["User-Agent"] = user_agent
    session.headers["Accept-Encoding"] = "identity"
    return session


def post_within(session: requests.Session, url: str, data: bytes, headers: dict, deadline_s: float) -> Answer:
    """POST `data` and read the answer, all within `deadline_s` seconds and at most MAX_ANSWER_BYTES of it.

    Raises DeadlineExceeded (a requests.Timeout) when the deadline passed, other requests exceptions for
    connection trouble; never returns after the deadline by more than the time to notice it."""
    deadline = _Deadline(deadline_s)
    _current.deadline = deadline
    deadline.start()
    try:
        resp = session.post(url, data=data, headers=headers, timeout=(deadline_s, deadline_s), stream=True)
        try:
            body = bytearray()
            while len(body) < MAX_ANSWER_BYTES:
                chunk = resp.raw.read(min(READ_CHUNK, MAX_ANSWER_BYTES - len(body)), decode_content=True)
                if not chunk:
                    break
                body += chunk
            cut = len(body) >= MAX_ANSWER_BYTES
        finally:
            resp.close()  # a connection with unread answer is closed, not reused
        if deadline.expired:
            raise DeadlineExceeded(f"no complete answer within {deadline_s:g}s")
        return Answer(resp.status_code, resp.headers, bytes(body).decode("utf-8", "replace"), cut)
    except requests.RequestException:
        if deadline.expired:
            raise DeadlineExceeded(f"no complete answer within {deadline_s:g}s") from None
        raise
    except Exception as exc:  # noqa: BLE001 - urllib3/http.client errors while reading the body, re-raised as one
        if deadline.expired:
            raise DeadlineExceeded(f"no complete answer within {deadline_s:g}s") from None
        raise requests.ConnectionError(type(exc).__name__) from None
    finally:
        deadline.finish()
        _current.deadline = None
