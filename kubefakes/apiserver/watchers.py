"""Watch streams: the per-watch queue fed by the store, and the HTTP stream that drains it.

A watch is a chunked JSON-lines response; bookmarks, the initial-events end marker, clean close
(`CLOSE_WATCH`) and abrupt reset (`ABORT_WATCH`) behave as on kube-apiserver.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from kubefakes.apiserver.resources import (
    ResourceInfo,
    object_meta,
    with_type,
)

if TYPE_CHECKING:
    from kubefakes.apiserver.store import Table


class Event:
    """One committed change (rv, ADDED/MODIFIED/DELETED, new and old object); lines encoded once, lazily."""

    __slots__ = ("rv", "type", "obj", "old", "_lines")

    def __init__(self, rv: int, type_: str, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
        self.rv = rv
        self.type = type_
        self.obj = obj
        self.old = old
        self._lines: dict[str, bytes] = {}

    def line(self, info: ResourceInfo, type_: str) -> bytes:
        # One serialisation per event and type, shared by every watcher.
        cached = self._lines.get(type_)
        if cached is None:
            cached = json.dumps({"type": type_, "object": with_type(info, self.obj)}).encode() + b"\n"
            self._lines[type_] = cached
        return cached


CLOSE_WATCH = object()
ABORT_WATCH = object()


class Watcher:
    """One open watch: its filter and an asyncio queue of ready-to-send lines (owned by the loop)."""

    def __init__(
        self,
        table: Table,
        namespace: str | None,
        matcher: Callable[[Mapping[str, Any]], bool] | None,
        start_rv: int,
    ) -> None:
        self.table = table
        self.namespace = namespace
        self.matcher = matcher
        self.start_rv = start_rv
        self.queue: asyncio.Queue[Any] = asyncio.Queue()

    def _selected(self, obj: Mapping[str, Any] | None) -> bool:
        if obj is None:
            return False
        if self.namespace is not None and object_meta(obj).get("namespace") != self.namespace:
            return False
        return self.matcher is None or self.matcher(obj)

    def offer(self, ev: Event) -> None:
        if ev.rv <= self.start_rv:
            return
        info = self.table.info
        if ev.type == "ADDED":
            if self._selected(ev.obj):
                self.queue.put_nowait(ev.line(info, "ADDED"))
        elif ev.type == "DELETED":
            if self._selected(ev.obj):
                self.queue.put_nowait(ev.line(info, "DELETED"))
        else:
            # An object leaving or entering the selection is DELETED/ADDED for this watcher.
            was, now = self._selected(ev.old), self._selected(ev.obj)
            if was and now:
                self.queue.put_nowait(ev.line(info, "MODIFIED"))
            elif now:
                self.queue.put_nowait(ev.line(info, "ADDED"))
            elif was:
                self.queue.put_nowait(ev.line(info, "DELETED"))
