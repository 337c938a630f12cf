"""Fault injection: make matching requests fail with a given status, or stall."""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass
from typing import Any

from kubefakes.apiserver.resources import (
    ResourceInfo,
)
from kubefakes.apiserver.status import (
    STALE,
    ApiStatusError,
    conflict,
    not_found,
    status_body,
)


@dataclass
class Fault:
    """Make the next `times` matching requests fail or stall.

    Matching: `verb` is a Kubernetes verb (get, list, watch, create, update, patch, delete) or an HTTP
    method (GET, POST, ...); `resource` a plural (``pods``); `subresource` (``binding``, ``status``; None
    matches any, ``""`` only the main resource); `name`/`namespace`; `path` a regex searched in the URL
    path. Unset fields match anything.
    Effect: wait until `gate` is set (a `threading.Event`: a test holds a request back exactly as long
    as it needs to, however slow the machine), then `delay_s` (with `status` None the request then
    proceeds normally), then answer `status` with a Status body (and ``Retry-After`` for 429), or stall
    for `hang_s` and answer 504.
    """

    verb: str | None = None
    resource: str | None = None
    subresource: str | None = None
    name: str | None = None
    namespace: str | None = None
    path: str | None = None
    status: int | None = 500
    message: str | None = None
    times: int = 1
    delay_s: float = 0.0
    hang_s: float | None = None
    retry_after_s: int = 1
    gate: threading.Event | None = None
    hits: int = 0

    def matches(
        self, verb: str, method: str, resource: str, subresource: str, name: str, namespace: str, path: str
    ) -> bool:
        if self.verb is not None and self.verb not in (verb, method):
            return False
        if self.resource is not None and self.resource != resource:
            return False
        if self.subresource is not None and self.subresource != subresource:
            return False
        if self.name is not None and self.name != name:
            return False
        if self.namespace is not None and self.namespace != namespace:
            return False
        return self.path is None or re.search(self.path, path) is not None


class FaultInjector:
    """The active faults; the first matching fault with uses left serves each request."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._faults: list[Fault] = []

    def add(self, fault: Fault | None = None, /, **kwargs: Any) -> Fault:
        """Add a fault (a `Fault` or its fields as keywords); returns it (``.hits`` counts uses)."""
        f = fault if fault is not None else Fault(**kwargs)
        with self._lock:
            self._faults.append(f)
        return f

    def clear(self) -> None:
        with self._lock:
            self._faults.clear()

    def take(self, *args: str) -> Fault | None:
        with self._lock:
            for f in self._faults:
                if f.times > 0 and f.matches(*args):
                    f.times -= 1
                    f.hits += 1
                    if f.times == 0:
                        self._faults.remove(f)
                    return f
        return None


def fault_status(f: Fault, info: ResourceInfo | None, name: str) -> ApiStatusError:
    code = f.status or 500
    if code == 409 and info is not None:
        err = conflict(info, name, f.message or STALE)
        return err
    if code == 404 and info is not None:
        return not_found(info, name)
    if code == 429:
        return ApiStatusError(
            429,
            status_body(
                429,
                f.message or "Too many requests, please try again later.",
                details={"retryAfterSeconds": f.retry_after_s},
            ),
            {"Retry-After": str(f.retry_after_s)},
        )
    if code == 500:
        msg = f.message or "injected fault"
        return ApiStatusError(
            500, status_body(500, f"Internal error occurred: {msg}", details={"causes": [{"message": msg}]})
        )
    if code == 410:
        return ApiStatusError(
            410, status_body(410, f.message or "too old resource version", reason="Expired")
        )
    return ApiStatusError(code, status_body(code, f.message or f"injected {code}"))
