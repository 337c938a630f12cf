"""One resource's table in the in-memory API server: its objects, its event history (`Event`) and its
open watches (`Watcher`, the per-watch queue the store feeds).

The floor below `kubefakes.apiserver.store` (which commits into tables), `kubefakes.apiserver.writes`
(its write verbs) and `kubefakes.apiserver.watchers` (the HTTP stream that drains a watcher's queue).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from kubefakes.apiserver.resources import ResourceInfo, object_meta, with_type


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

    def selected(self, obj: Mapping[str, Any] | None) -> bool:
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
            if self.selected(ev.obj):
                self.queue.put_nowait(ev.line(info, "ADDED"))
        elif ev.type == "DELETED":
            if self.selected(ev.obj):
                self.queue.put_nowait(ev.line(info, "DELETED"))
        else:
            # An object leaving or entering the selection is DELETED/ADDED for this watcher.
            was, now = self.selected(ev.old), self.selected(ev.obj)
            if was and now:
                self.queue.put_nowait(ev.line(info, "MODIFIED"))
            elif now:
                self.queue.put_nowait(ev.line(info, "ADDED"))
            elif was:
                self.queue.put_nowait(ev.line(info, "DELETED"))


class Table:
    """One resource's objects (by namespace and name; pods also by node), its bounded event history
    and its open watches."""

    def __init__(self, info: ResourceInfo) -> None:
        self.info = info
        self.objects: dict[str, dict[str, dict[str, Any]]] = {}  # namespace ("" if cluster) -> name -> obj
        self.by_node: dict[str, dict[tuple[str, str], None]] = {}  # pods only: spec.nodeName -> keys
        self.history: list[Event] = []
        self.compacted_rv = 0
        self.watchers: set[Watcher] = set()
        self.pending = 0  # events committed from other threads, not yet offered to watchers

    def get(self, ns: str, name: str) -> dict[str, Any] | None:
        bucket = self.objects.get(ns)
        return bucket.get(name) if bucket else None

    def put(self, ns: str, name: str, obj: dict[str, Any] | None, old: dict[str, Any] | None) -> None:
        if obj is None:
            bucket = self.objects.get(ns)
            if bucket is not None:
                bucket.pop(name, None)
                if not bucket:
                    del self.objects[ns]
        else:
            self.objects.setdefault(ns, {})[name] = obj
        if self.info.plural == "pods":
            old_node = ((old or {}).get("spec") or {}).get("nodeName") or ""
            new_node = ((obj or {}).get("spec") or {}).get("nodeName") or ""
            if old is not None and (obj is None or old_node != new_node):
                keys = self.by_node.get(old_node)
                if keys is not None:
                    keys.pop((ns, name), None)
                    if not keys:
                        del self.by_node[old_node]
            if obj is not None:
                self.by_node.setdefault(new_node, {})[(ns, name)] = None

    def iter_objects(self, ns: str | None) -> Iterable[dict[str, Any]]:
        if ns is not None:
            return list(self.objects.get(ns, {}).values())
        return [o for bucket in self.objects.values() for o in bucket.values()]

    def count(self) -> int:
        return sum(len(b) for b in self.objects.values())
