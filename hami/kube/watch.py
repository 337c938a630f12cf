"""One open watch stream: newline-delimited JSON events read off a urllib3 response (decoded by orjson:
every scheduled pod causes several watch events, each a whole Pod or Node).

The generated client's ``watch.Watch`` deserialises every object into model classes and cannot be
interrupted from another thread; this reader yields plain dicts and `close()` unblocks a reader that
is waiting in ``recv`` (how a reflector stops or relists at once).
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any

import orjson

from hami.errors import ApiError, ResourceExpired
from hami.kube.retry import TRANSPORT_ERRORS


class WatchStream:
    """One open watch: iterate ``(type, object)`` pairs; `close()` from any thread ends the iteration.

    Types are ``ADDED``, ``MODIFIED``, ``DELETED`` and ``BOOKMARK`` (object has only
    ``metadata.resourceVersion``). An ``ERROR`` event raises `ResourceExpired` (410) or `ApiError`.
    """

    def __init__(self, response: Any, what: str) -> None:
        self._resp = response
        self._what = what
        self._closed = False

    def __iter__(self) -> Iterator[tuple[str, dict[str, Any]]]:
        buffer = b""
        try:
            for chunk in self._resp.stream(amt=None, decode_content=False):
                if self._closed:
                    return
                buffer += chunk
                while True:
                    nl = buffer.find(b"\n")
                    if nl < 0:
                        break
                    line, buffer = buffer[:nl], buffer[nl + 1 :]
                    if not line.strip():
                        continue
                    event = orjson.loads(line)
                    type_ = event.get("type")
                    obj = event.get("object") or {}
                    if type_ == "ERROR":
                        code = obj.get("code")
                        message = f"{self._what}: {obj.get('message', 'watch error')}"
                        if code == 410:
                            raise ResourceExpired(message, status=410, reason=obj.get("reason"))
                        raise ApiError(message, status=code, reason=obj.get("reason"))
                    yield type_, obj
        except TRANSPORT_ERRORS:
            if not self._closed:
                raise
        finally:
            self._release()

    def close(self) -> None:
        """Stop the stream; safe from another thread while one is blocked reading it."""
        self._closed = True
        try:
            if hasattr(self._resp, "shutdown"):
                self._resp.shutdown()  # urllib3 >= 2.3: unblocks a reader stuck in recv
            else:
                sock = getattr(getattr(self._resp, "connection", None), "sock", None)
                if sock is not None:
                    sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def _release(self) -> None:
        try:
            self._resp.close()
            self._resp.release_conn()
        except Exception:  # noqa: BLE001 - best effort on a dead connection
            pass
