"""The object store behind the in-memory API server: tables, resourceVersions, reads and watches.

Everything here is synchronous and guarded by one lock; the HTTP layer and tests call `Store` directly.
The write verbs (create, update, patch, bind, delete) are in `kubefakes.apiserver.writes`. The rules
implemented (and why) are listed in the `kubefakes.apiserver` docstring.
"""

from __future__ import annotations

import asyncio
import bisect
import json
import threading
from collections.abc import Callable, Mapping
from typing import Any

from kubefakes.apiserver.patches import (
    deep_copy,
)
from kubefakes.apiserver.resources import (
    MERGE_PATCH,
    RESOURCES,
    object_meta,
    with_type,
)
from kubefakes.apiserver.selectors import (
    compile_matcher,
    parse_field_selector,
    parse_label_selector,
)
from kubefakes.apiserver.status import (
    ApiStatusError,
    bad_request,
    not_found,
    status_body,
)
from kubefakes.apiserver.table import Event, Table, Watcher
from kubefakes.apiserver.writes import StoreWrites


class Store(StoreWrites):
    """The thread-safe object store behind the server; also the direct handle tests seed and inspect.

    Object arguments and results are plain dicts in the API's JSON form. Results are copies: changing
    them changes nothing in the store. Errors are `ApiStatusError` with the real server's Status.
    """

    def __init__(self, *, history_size: int = 10000, graceful_pod_deletion: bool = False) -> None:
        self._lock = threading.RLock()
        self._rv = 0
        self._tables = {plural: Table(info) for plural, info in RESOURCES.items()}
        self.history_size = history_size
        # Real servers keep a bound, running pod until its kubelet confirms; without kubelets the
        # default is to delete at once, as if the kubelet confirmed immediately.
        self.graceful_pod_deletion = graceful_pod_deletion
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: int | None = None

    # -- public helpers for tests -------------------------------------------------------------------

    @property
    def resource_version(self) -> int:
        """The current global resourceVersion (an integer; the wire carries it as a string)."""
        with self._lock:
            return self._rv

    def get(self, resource: str, name: str, *, namespace: str | None = None) -> dict[str, Any] | None:
        """A copy of the stored object (with kind/apiVersion), or None when absent."""
        table = self._table(resource)
        with self._lock:
            obj = table.get(self._ns(table, namespace), name)
            return deep_copy(with_type(table.info, obj)) if obj is not None else None

    def list(
        self,
        resource: str,
        *,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> list[dict[str, Any]]:
        """Copies of the matching objects, sorted by namespace and name."""
        items, _ = self.list_objects(
            resource, namespace=namespace, label_selector=label_selector, field_selector=field_selector
        )
        return [deep_copy(with_type(self._tables[resource].info, o)) for o in items]

    def create(
        self, resource: str, obj: Mapping[str, Any], *, namespace: str | None = None, keep_status: bool = True
    ) -> dict[str, Any]:
        """Create an object (test seeding). Unlike the HTTP API, a pod's status is kept by default."""
        table = self._table(resource)
        ns = namespace if namespace is not None else object_meta(obj).get("namespace")
        return deep_copy(
            self.do_create(table, self._ns(table, ns), deep_copy(dict(obj)), keep_status=keep_status)
        )

    def create_any(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        """Create an object whose ``kind`` names its resource (Pod, Node, Event, ...); status is kept."""
        kind = obj.get("kind")
        for info in RESOURCES.values():
            if info.kind == kind:
                return self.create(info.plural, obj)
        raise ValueError(f"kind {kind!r}: want one of {sorted(i.kind for i in RESOURCES.values())}")

    def update(
        self, resource: str, obj: Mapping[str, Any], *, subresource: str | None = None
    ) -> dict[str, Any]:
        """Replace an object (PUT semantics, incl. the resourceVersion check if the object has one)."""
        table = self._table(resource)
        meta = object_meta(obj)
        return deep_copy(
            self.do_update(
                table,
                self._ns(table, meta.get("namespace")),
                meta.get("name", ""),
                deep_copy(dict(obj)),
                subresource,
            )
        )

    def patch(
        self,
        resource: str,
        name: str,
        patch: Any,
        *,
        namespace: str | None = None,
        patch_type: str = MERGE_PATCH,
        subresource: str | None = None,
    ) -> dict[str, Any]:
        """Patch an object; `patch_type` is one of the three patch content types."""
        table = self._table(resource)
        return deep_copy(
            self.do_patch(table, self._ns(table, namespace), name, patch, patch_type, subresource)
        )

    def delete(
        self, resource: str, name: str, *, namespace: str | None = None, grace_period_s: int | None = 0
    ) -> dict[str, Any]:
        """Delete an object, at once by default (grace period 0). With ``graceful_pod_deletion`` a pod
        deleted with another `grace_period_s` (None: its ``terminationGracePeriodSeconds``) only gets
        its ``deletionTimestamp``, as kube-apiserver does until the kubelet reports it gone."""
        table = self._table(resource)
        options = {} if grace_period_s is None else {"gracePeriodSeconds": grace_period_s}
        return deep_copy(self.do_delete(table, self._ns(table, namespace), name, options))

    def set_pod_phase(self, namespace: str, name: str, phase: str) -> dict[str, Any]:
        """Convenience for tests: merge-patch ``status.phase`` through the status subresource."""
        return self.patch(
            "pods", name, {"status": {"phase": phase}}, namespace=namespace, subresource="status"
        )

    def compact(self) -> None:
        """Forget all event history: a watch from any older resourceVersion now gets ``410 Expired``."""
        with self._lock:
            for table in self._tables.values():
                table.history.clear()
                table.compacted_rv = self._rv

    def count(self, resource: str) -> int:
        """Number of stored objects of `resource`."""
        with self._lock:
            return self._table(resource).count()

    # -- internals used by the HTTP layer ----------------------------------------------------------

    def _table(self, resource: str) -> Table:
        try:
            return self._tables[resource]
        except KeyError:
            raise ValueError(f"resource {resource!r}: want one of {sorted(self._tables)}") from None

    @staticmethod
    def _ns(table: Table, namespace: str | None) -> str:
        if not table.info.namespaced:
            return ""
        return namespace or "default"

    def _commit(
        self, table: Table, type_: str, ns: str, name: str, obj: dict[str, Any], old: dict[str, Any] | None
    ) -> None:
        # Called with the lock held; `obj` already carries the new resourceVersion.
        table.put(ns, name, None if type_ == "DELETED" else obj, old)
        ev = Event(self._rv, type_, obj, old)
        table.history.append(ev)
        if len(table.history) > self.history_size * 5 // 4:
            drop = len(table.history) - self.history_size
            table.compacted_rv = table.history[drop - 1].rv
            del table.history[:drop]
        if not table.watchers:
            return
        if self._loop is not None and threading.get_ident() != self._loop_thread:
            table.pending += 1
            self._loop.call_soon_threadsafe(self._deliver_later, table, ev)
        else:
            for w in list(table.watchers):
                w.offer(ev)

    def _deliver_later(self, table: Table, ev: Event) -> None:
        with self._lock:
            table.pending -= 1
            for w in list(table.watchers):
                w.offer(ev)

    def _next_rv(self) -> str:
        self._rv += 1
        return str(self._rv)

    def list_objects(
        self,
        resource: str,
        *,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> tuple[list[dict[str, Any]], int]:
        """Stored (shared, do not mutate) matching objects sorted by (namespace, name), and the list rv."""
        table = self._table(resource)
        matcher = compile_matcher(
            parse_label_selector(label_selector),
            parse_field_selector(field_selector, table.info.field_labels),
        )
        node = None
        if table.info.plural == "pods" and field_selector:
            for part in field_selector.split(","):
                k, sep, v = part.partition("=")
                if sep and k.strip() == "spec.nodeName" and not k.endswith("!"):
                    node = v.lstrip("=").strip()
        with self._lock:
            if node is not None:
                keys = table.by_node.get(node, {})
                candidates = [table.get(ns, n) for ns, n in keys if namespace is None or ns == namespace]
            else:
                candidates = table.iter_objects(namespace if table.info.namespaced else None)
            items = [o for o in candidates if o is not None and (matcher is None or matcher(o))]
            rv = self._rv
        items.sort(key=lambda o: (object_meta(o).get("namespace", ""), object_meta(o).get("name", "")))
        return items, rv

    def get_object(self, table: Table, ns: str, name: str) -> dict[str, Any]:
        with self._lock:
            obj = table.get(ns, name)
        if obj is None:
            raise not_found(table.info, name)
        return obj

    def open_watch(
        self,
        table: Table,
        namespace: str | None,
        matcher: Callable[[Mapping[str, Any]], bool] | None,
        resource_version: str | None,
        send_initial_events: bool | None,
    ) -> tuple[Watcher, list[bytes]]:
        """Register a watcher (on the loop thread) and return it with its first lines to send.

        Raises ApiStatusError 410 when `resource_version` is older than the retained history.
        """
        info = table.info
        with self._lock:
            current = self._rv
            w = Watcher(table, namespace, matcher, current)
            lines: list[bytes] = []
            if resource_version in (None, "", "0") or send_initial_events:
                # "Get state and start at most recent": synthetic ADDED for everything that exists.
                objs = table.iter_objects(namespace if info.namespaced else None)
                for o in objs:
                    if w.selected(o):
                        lines.append(
                            json.dumps({"type": "ADDED", "object": with_type(info, o)}).encode() + b"\n"
                        )
            else:
                try:
                    since = int(resource_version)
                except ValueError:
                    raise bad_request(f'invalid resource version "{resource_version}"') from None
                if since < table.compacted_rv:
                    raise ApiStatusError(
                        410,
                        status_body(
                            410,
                            f"too old resource version: {since} ({table.compacted_rv})",
                            reason="Expired",
                        ),
                    )
                start = bisect.bisect_right(table.history, since, key=lambda e: e.rv)
                replay = table.history[start:]
                w.start_rv = since
                for ev in replay:
                    w.offer(ev)
                w.start_rv = max(since, current)
            table.watchers.add(w)
        return w, lines

    def close_watch(self, w: Watcher) -> None:
        with self._lock:
            w.table.watchers.discard(w)

    def bookmark_rv(self, table: Table) -> int | None:
        """The rv a bookmark may carry now, or None while events for this table are still in flight."""
        with self._lock:
            return None if table.pending else self._rv

    def detach_loop(self) -> None:
        """The server stopped: forget its loop and watchers (the store stays usable for assertions)."""
        with self._lock:
            self._loop = None
            for table in self._tables.values():
                table.watchers.clear()
                table.pending = 0

    def all_watchers(self) -> list[Watcher]:
        with self._lock:
            return [w for t in self._tables.values() for w in t.watchers]
