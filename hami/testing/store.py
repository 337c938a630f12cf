"""The object store behind the in-memory API server: resources, Status errors, validation, events.

Split from `hami.testing.apiserver` (the HTTP layer) so each file reads on its own. Everything here
is synchronous and guarded by one lock; the HTTP layer and tests call `Store` directly. The rules
implemented (and why) are listed in the `hami.testing.apiserver` docstring.
"""

from __future__ import annotations

import asyncio
import bisect
import json
import logging
import random
import re
import threading
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from hami.testing.patches import PatchError, deep_copy, json_patch, merge_patch, strategic_merge_patch
from hami.testing.selectors import (
    compile_matcher,
    parse_field_selector,
    parse_label_selector,
)

log = logging.getLogger(__name__)

JSON = "application/json"
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
JSON_PATCH = "application/json-patch+json"

# ---------------------------------------------------------------------------------------------------
# Resources


@dataclass(frozen=True, slots=True)
class ResourceInfo:
    """One served resource: its group/version, names, scope and the field labels it can select on."""

    group: str  # "" for core
    version: str
    plural: str
    kind: str
    namespaced: bool
    status_subresource: bool
    field_labels: frozenset[str]

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def qualified(self) -> str:
        """``pods`` or ``leases.coordination.k8s.io`` (the form used in NotFound/Conflict messages)."""
        return f"{self.plural}.{self.group}" if self.group else self.plural

    @property
    def qualified_kind(self) -> str:
        """``Pod`` or ``Lease.coordination.k8s.io`` (the form used in Invalid messages)."""
        return f"{self.kind}.{self.group}" if self.group else self.kind


_META = frozenset({"metadata.name", "metadata.namespace"})
RESOURCES: dict[str, ResourceInfo] = {
    r.plural: r
    for r in (
        ResourceInfo(
            "",
            "v1",
            "pods",
            "Pod",
            True,
            True,
            _META
            | {
                "spec.nodeName",
                "spec.schedulerName",
                "spec.restartPolicy",
                "spec.serviceAccountName",
                "spec.hostNetwork",
                "status.phase",
                "status.podIP",
                "status.nominatedNodeName",
            },
        ),
        ResourceInfo("", "v1", "nodes", "Node", False, True, _META | {"spec.unschedulable"}),
        ResourceInfo(
            "",
            "v1",
            "events",
            "Event",
            True,
            False,
            _META
            | {
                "involvedObject.kind",
                "involvedObject.namespace",
                "involvedObject.name",
                "involvedObject.uid",
                "involvedObject.apiVersion",
                "involvedObject.resourceVersion",
                "involvedObject.fieldPath",
                "reason",
                "reportingComponent",
                "source",
                "type",
            },
        ),
        ResourceInfo("", "v1", "resourcequotas", "ResourceQuota", True, True, _META),
        ResourceInfo("", "v1", "namespaces", "Namespace", False, True, _META | {"status.phase"}),
        ResourceInfo("coordination.k8s.io", "v1", "leases", "Lease", True, False, _META),
    )
}
BY_GROUP: dict[tuple[str, str], dict[str, ResourceInfo]] = {}
for _r in RESOURCES.values():
    BY_GROUP.setdefault((_r.group, _r.version), {})[_r.plural] = _r

# ---------------------------------------------------------------------------------------------------
# Status errors


_REASONS = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    409: "Conflict",
    410: "Expired",
    415: "UnsupportedMediaType",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}


def status_body(
    code: int, message: str, *, reason: str | None = None, details: dict[str, Any] | None = None
) -> dict[str, Any]:
    """A ``meta/v1 Status`` with the real server's key order (``status: Failure``)."""
    body: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason if reason is not None else _REASONS.get(code, ""),
    }
    if details is not None:
        body["details"] = details
    body["code"] = code
    return body


class ApiStatusError(Exception):
    """An error answer: HTTP `code` with a Status body (raised by the store, rendered by the server)."""

    def __init__(self, code: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> None:
        super().__init__(body.get("message", ""))
        self.code = code
        self.body = body
        self.headers = headers or {}


def status_details(info: ResourceInfo, name: str, **extra: Any) -> dict[str, Any]:
    d: dict[str, Any] = {"name": name}
    if info.group:
        d["group"] = info.group
    d["kind"] = info.plural
    d.update(extra)
    return d


def not_found(info: ResourceInfo, name: str) -> ApiStatusError:
    return ApiStatusError(
        404, status_body(404, f'{info.qualified} "{name}" not found', details=status_details(info, name))
    )


def already_exists(info: ResourceInfo, name: str) -> ApiStatusError:
    return ApiStatusError(
        409,
        status_body(
            409,
            f'{info.qualified} "{name}" already exists',
            reason="AlreadyExists",
            details=status_details(info, name),
        ),
    )


def conflict(info: ResourceInfo, name: str, why: str, *, qualified: str | None = None) -> ApiStatusError:
    q = qualified or info.qualified
    details = {"name": name, **({"group": info.group} if info.group else {}), "kind": q.split(".")[0]}
    return ApiStatusError(
        409, status_body(409, f'Operation cannot be fulfilled on {q} "{name}": {why}', details=details)
    )


def check_uid_precondition(info: ResourceInfo, name: str, uid: str | None, cur_meta: dict[str, Any]) -> None:
    """Raise the real server's 409 when a UID precondition (binding target, delete options) is stale."""
    if uid and uid != cur_meta.get("uid"):
        raise conflict(
            info,
            name,
            f"Precondition failed: UID in precondition: {uid}, UID in object meta: {cur_meta.get('uid')}",
        )


STALE = "the object has been modified; please apply your changes to the latest version and try again"


def invalid(info: ResourceInfo, name: str, causes: list[tuple[str, str, str]]) -> ApiStatusError:
    """422: `causes` are (field, reason e.g. FieldValueRequired, text like 'Required value: ...')."""
    text = ", ".join(f"{f}: {m}" for f, _, m in causes)
    if len(causes) > 1:
        text = "[" + text + "]"
    details: dict[str, Any] = {"name": name}
    if info.group:
        details["group"] = info.group
    details["kind"] = info.kind
    details["causes"] = [{"reason": r, "message": m, "field": f} for f, r, m in causes]
    return ApiStatusError(
        422, status_body(422, f'{info.qualified_kind} "{name}" is invalid: {text}', details=details)
    )


def method_not_allowed() -> ApiStatusError:
    return ApiStatusError(
        405, status_body(405, "the server does not allow this method on the requested resource")
    )


def bad_request(message: str) -> ApiStatusError:
    return ApiStatusError(400, status_body(400, message))


# ---------------------------------------------------------------------------------------------------
# Validation (the subset of ObjectMeta validation our objects can trip)

_DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_QUALIFIED_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_SUBDOMAIN_MSG = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', "
    "and must start and end with an alphanumeric character (e.g. 'example.com', regex used for "
    "validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
)
_LABEL_MSG = (
    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must "
    "start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for "
    "validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')"
)
_MAX_ANNOTATIONS_BYTES = 256 * 1024


def _key_errors(path: str, key: str) -> list[tuple[str, str, str]]:
    name = key
    if "/" in key:
        prefix, name = key.split("/", 1)
        if not prefix or len(prefix) > 253 or not _DNS1123_SUBDOMAIN.match(prefix):
            return [(path, "FieldValueInvalid", f'Invalid value: "{key}": prefix part {_SUBDOMAIN_MSG}')]
    if not name or len(name) > 63 or not _QUALIFIED_NAME.match(name):
        return [
            (
                path,
                "FieldValueInvalid",
                f"Invalid value: \"{key}\": name part must consist of alphanumeric characters, '-', '_' "
                "or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or "
                "'my.name',  or '123-abc', regex used for validation is "
                "'([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]') and must be no more than 63 characters",
            )
        ]
    return []


def _validate(info: ResourceInfo, obj: dict[str, Any]) -> None:
    meta = obj.get("metadata")
    if not isinstance(meta, dict):
        raise bad_request(
            f'{info.kind} in version "{info.version}" cannot be handled as a {info.kind}: '
            "metadata must be an object"
        )
    name = meta.get("name") or ""
    causes: list[tuple[str, str, str]] = []
    if not name:
        causes.append(
            ("metadata.name", "FieldValueRequired", "Required value: name or generateName is required")
        )
    else:
        pattern = _DNS1123_LABEL if info.plural == "namespaces" else _DNS1123_SUBDOMAIN
        limit = 63 if info.plural == "namespaces" else 253
        if len(name) > limit or not pattern.match(name):
            msg = _LABEL_MSG if info.plural == "namespaces" else _SUBDOMAIN_MSG
            causes.append(("metadata.name", "FieldValueInvalid", f'Invalid value: "{name}": {msg}'))
    for section in ("labels", "annotations"):
        values = meta.get(section)
        if values is None:
            continue
        if not isinstance(values, dict) or not all(isinstance(v, str) for v in values.values()):
            raise bad_request(
                f'{info.kind} in version "{info.version}" cannot be handled as a {info.kind}: json: '
                f"cannot unmarshal into Go struct field ObjectMeta.metadata.{section} of type string"
            )
        for k, v in values.items():
            causes.extend(_key_errors(f"metadata.{section}", k))
            if section == "labels" and (len(v) > 63 or not _LABEL_VALUE.match(v)):
                causes.append(
                    (
                        "metadata.labels",
                        "FieldValueInvalid",
                        f'Invalid value: "{v}": a valid label must be an empty string or consist of '
                        "alphanumeric characters, '-', '_' or '.', and must start and end with an "
                        "alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used "
                        "for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')",
                    )
                )
        if section == "annotations":
            size = sum(len(k) + len(v) for k, v in values.items())
            if size > _MAX_ANNOTATIONS_BYTES:
                causes.append(
                    (
                        "metadata.annotations",
                        "FieldValueTooLong",
                        f"Too long: must have at most {_MAX_ANNOTATIONS_BYTES} bytes",
                    )
                )
    if causes:
        raise invalid(info, name, causes)


# ---------------------------------------------------------------------------------------------------
# Store


def _now_rfc3339() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def with_type(info: ResourceInfo, obj: dict[str, Any]) -> dict[str, Any]:
    """Objects are stored without kind/apiVersion (list items have none); single answers get them."""
    return {"kind": info.kind, "apiVersion": info.api_version, **obj}


def object_meta(obj: Mapping[str, Any]) -> dict[str, Any]:
    return obj.get("metadata") or {}


class _Event:
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

    def offer(self, ev: _Event) -> None:
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


class Table:
    def __init__(self, info: ResourceInfo) -> None:
        self.info = info
        self.objects: dict[str, dict[str, dict[str, Any]]] = {}  # namespace ("" if cluster) -> name -> obj
        self.by_node: dict[str, dict[tuple[str, str], None]] = {}  # pods only: spec.nodeName -> keys
        self.history: list[_Event] = []
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


def _strip_rv(obj: Mapping[str, Any]) -> dict[str, Any]:
    meta = dict(object_meta(obj))
    meta.pop("resourceVersion", None)
    return {**obj, "metadata": meta}


class Store:
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

    def delete(self, resource: str, name: str, *, namespace: str | None = None) -> dict[str, Any]:
        """Delete an object at once (grace period 0)."""
        table = self._table(resource)
        return deep_copy(self.do_delete(table, self._ns(table, namespace), name, {"gracePeriodSeconds": 0}))

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
        ev = _Event(self._rv, type_, obj, old)
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

    def _deliver_later(self, table: Table, ev: _Event) -> None:
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

    def do_create(
        self, table: Table, ns: str, obj: dict[str, Any], *, keep_status: bool = False, dry_run: bool = False
    ) -> dict[str, Any]:
        info = table.info
        if not isinstance(obj, dict):
            raise bad_request(f'{info.kind} in version "{info.version}" cannot be handled as a {info.kind}')
        obj.pop("kind", None)
        obj.pop("apiVersion", None)
        meta = obj.setdefault("metadata", {})
        if not isinstance(meta, dict):
            raise bad_request("metadata must be an object")
        if info.namespaced:
            if meta.get("namespace") and meta["namespace"] != ns:
                raise bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request"
                )
            meta["namespace"] = ns
        else:
            meta.pop("namespace", None)
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + "".join(random.choices("bcdfghjklmnpqrstvwxz2456789", k=5))
        _validate(info, obj)
        for k in ("resourceVersion", "deletionTimestamp", "deletionGracePeriodSeconds", "selfLink"):
            meta.pop(k, None)
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = _now_rfc3339()
        self._prepare_create(info, obj, keep_status)
        name = meta["name"]
        with self._lock:
            if table.get(ns, name) is not None:
                raise already_exists(info, name)
            if dry_run:
                meta["resourceVersion"] = str(self._rv)
                return with_type(info, obj)
            meta["resourceVersion"] = self._next_rv()
            self._commit(table, "ADDED", ns, name, obj, None)
        return with_type(info, obj)

    @staticmethod
    def _prepare_create(info: ResourceInfo, obj: dict[str, Any], keep_status: bool) -> None:
        if info.plural == "pods":
            spec = obj.setdefault("spec", {})
            spec.setdefault("schedulerName", "default-scheduler")
            spec.setdefault("restartPolicy", "Always")
            spec.setdefault("dnsPolicy", "ClusterFirst")
            spec.setdefault("terminationGracePeriodSeconds", 30)
            if not keep_status or not isinstance(obj.get("status"), dict):
                obj["status"] = {"phase": "Pending"}
            obj["status"].setdefault("phase", "Pending")
        elif info.plural == "resourcequotas" and not keep_status:
            obj["status"] = {}
        elif info.plural == "namespaces":
            obj.setdefault("spec", {"finalizers": ["kubernetes"]})
            obj["status"] = {"phase": "Active"}
            obj["metadata"].setdefault("labels", {})["kubernetes.io/metadata.name"] = obj["metadata"]["name"]

    def _finish_write(
        self,
        table: Table,
        ns: str,
        name: str,
        cur: dict[str, Any],
        new: dict[str, Any],
        subresource: str | None,
        dry_run: bool = False,
    ) -> dict[str, Any]:
        """Common tail of update and patch: subresource rules, validation, rv check, no-op detection."""
        info = table.info
        if not isinstance(new, dict) or not isinstance(new.get("metadata"), dict):
            raise bad_request(f'{info.kind} in version "{info.version}" cannot be handled as a {info.kind}')
        new.pop("kind", None)
        new.pop("apiVersion", None)
        meta = new["metadata"]
        cur_meta = object_meta(cur)
        if meta.get("name", name) != name:
            raise bad_request(
                f"the name of the object ({meta.get('name')}) does not match the name on the URL ({name})"
            )
        if info.namespaced and meta.get("namespace", ns) != ns:
            raise bad_request(
                "the namespace of the provided object does not match the namespace sent on the request"
            )
        wanted_rv = meta.get("resourceVersion")
        if wanted_rv not in (None, "") and str(wanted_rv) != cur_meta.get("resourceVersion"):
            raise conflict(info, name, STALE)
        uid = meta.get("uid")
        if uid and uid != cur_meta.get("uid"):
            raise conflict(
                info,
                name,
                f"Precondition failed: UID in precondition: {uid}, UID in object meta: {cur_meta.get('uid')}",
            )
        if subresource == "status":
            # Only status changes through /status (spec and metadata come from the stored object).
            new = {**cur, "status": new.get("status", cur.get("status"))}
            if new.get("status") is None:
                new.pop("status")
        else:
            if info.status_subresource:
                if "status" in cur:
                    new["status"] = cur["status"]
                else:
                    new.pop("status", None)
            for k in (
                "uid",
                "creationTimestamp",
                "deletionTimestamp",
                "deletionGracePeriodSeconds",
                "generateName",
            ):
                if k in cur_meta:
                    meta[k] = cur_meta[k]
                else:
                    meta.pop(k, None)
            if info.namespaced:
                meta["namespace"] = ns
            meta["name"] = name
            _validate(info, new)
        if info.plural == "pods" and subresource != "status":
            old_node = (cur.get("spec") or {}).get("nodeName")
            new_node = (new.get("spec") or {}).get("nodeName")
            if old_node and new_node != old_node:
                raise invalid(
                    info,
                    name,
                    [
                        (
                            "spec",
                            "FieldValueForbidden",
                            "Forbidden: pod updates may not change fields other than "
                            "`spec.containers[*].image`,`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,"
                            "`spec.tolerations` (only additions to existing tolerations),"
                            "`spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was previously negative)",
                        )
                    ],
                )
        with self._lock:
            latest = table.get(ns, name)
            if latest is None:
                raise not_found(info, name)
            if latest is not cur:
                # Another writer got in between our read and this write: only a request that named a
                # resourceVersion fails; otherwise the real server retries the update internally.
                if wanted_rv not in (None, ""):
                    raise conflict(info, name, STALE)
                raise _Retry
            if _strip_rv(new) == _strip_rv(cur):
                return with_type(info, cur)  # a no-op write: no new resourceVersion, no event
            if dry_run:
                return with_type(info, new)
            new.setdefault("metadata", {})["resourceVersion"] = self._next_rv()
            self._commit(table, "MODIFIED", ns, name, new, cur)
        return with_type(info, new)

    def do_update(
        self, table: Table, ns: str, name: str, body: Any, subresource: str | None, dry_run: bool = False
    ) -> dict[str, Any]:
        while True:
            cur = self.get_object(table, ns, name)
            try:
                return self._finish_write(table, ns, name, cur, deep_copy(body), subresource, dry_run)
            except _Retry:
                continue

    def do_patch(
        self,
        table: Table,
        ns: str,
        name: str,
        patch: Any,
        patch_type: str,
        subresource: str | None,
        dry_run: bool = False,
    ) -> dict[str, Any]:
        info = table.info
        while True:
            cur = self.get_object(table, ns, name)
            base = with_type(info, cur)
            try:
                if patch_type == MERGE_PATCH:
                    if not isinstance(patch, dict):
                        raise PatchError("merge patch must be a JSON object", invalid=False)
                    new = merge_patch(base, patch)
                elif patch_type == STRATEGIC_MERGE_PATCH:
                    if not isinstance(patch, dict):
                        raise PatchError("strategic merge patch must be a JSON object", invalid=False)
                    new = strategic_merge_patch(base, patch)
                elif patch_type == JSON_PATCH:
                    new = json_patch(base, patch)
                else:
                    raise ApiStatusError(
                        415,
                        status_body(
                            415,
                            f"the body of the request was in an unknown format - accepted media types include: "
                            f"{JSON_PATCH}, {MERGE_PATCH}, {STRATEGIC_MERGE_PATCH}, application/apply-patch+yaml",
                        ),
                    )
            except PatchError as e:
                if e.invalid:
                    raise invalid(
                        info,
                        name,
                        [("patch", "FieldValueInvalid", f"Invalid value: {json.dumps(patch)!r}: {e}")],
                    ) from None
                raise bad_request(str(e)) from None
            # merge/strategic patches share unchanged subtrees with `cur`; copy before it is stored.
            new = deep_copy(new)
            try:
                return self._finish_write(table, ns, name, cur, new, subresource, dry_run)
            except _Retry:
                continue

    def do_bind(self, ns: str, pod_name: str, binding: Any, dry_run: bool = False) -> None:
        """Create a Binding: set spec.nodeName (409 if already bound or being deleted)."""
        table = self._tables["pods"]
        info = table.info
        if not isinstance(binding, dict):
            raise bad_request('Binding in version "v1" cannot be handled as a Binding')
        meta = binding.get("metadata") or {}
        if meta.get("name") and meta["name"] != pod_name:
            raise bad_request("name in URL does not match name in Binding object")
        target = binding.get("target") or {}
        if target.get("kind") not in (None, "", "Node"):
            raise bad_request("Binding target kind must be Node")
        node = target.get("name") or ""
        if not node:
            raise invalid(
                ResourceInfo("", "v1", "bindings", "Binding", True, False, frozenset()),
                pod_name,
                [("target.name", "FieldValueRequired", "Required value")],
            )
        with self._lock:
            cur = table.get(ns, pod_name)
            if cur is None:
                raise not_found(info, pod_name)
            cur_meta = object_meta(cur)
            check_uid_precondition(info, pod_name, meta.get("uid"), cur_meta)
            if meta.get("resourceVersion") and meta["resourceVersion"] != cur_meta.get("resourceVersion"):
                raise conflict(info, pod_name, STALE)
            if cur_meta.get("deletionTimestamp"):
                raise conflict(
                    info,
                    pod_name,
                    f"pod {pod_name} is being deleted, cannot be assigned to a host",
                    qualified="pods/binding",
                )
            bound = (cur.get("spec") or {}).get("nodeName")
            if bound:
                raise conflict(
                    info,
                    pod_name,
                    f'pod {pod_name} is already assigned to node "{bound}"',
                    qualified="pods/binding",
                )
            if dry_run:
                return
            new = deep_copy(cur)
            new["spec"]["nodeName"] = node
            if meta.get("annotations"):
                new["metadata"].setdefault("annotations", {}).update(meta["annotations"])
            status = new.setdefault("status", {})
            conditions = [c for c in status.get("conditions", []) if c.get("type") != "PodScheduled"]
            conditions.append(
                {
                    "type": "PodScheduled",
                    "status": "True",
                    "lastProbeTime": None,
                    "lastTransitionTime": _now_rfc3339(),
                }
            )
            status["conditions"] = conditions
            new["metadata"]["resourceVersion"] = self._next_rv()
            self._commit(table, "MODIFIED", ns, pod_name, new, cur)

    def do_delete(
        self, table: Table, ns: str, name: str, options: Any, dry_run: bool = False
    ) -> dict[str, Any]:
        info = table.info
        options = options if isinstance(options, dict) else {}
        pre = options.get("preconditions") or {}
        with self._lock:
            cur = table.get(ns, name)
            if cur is None:
                raise not_found(info, name)
            cur_meta = object_meta(cur)
            check_uid_precondition(info, name, pre.get("uid"), cur_meta)
            if pre.get("resourceVersion") and pre["resourceVersion"] != cur_meta.get("resourceVersion"):
                raise conflict(
                    info,
                    name,
                    f"Precondition failed: ResourceVersion in precondition: {pre['resourceVersion']}, "
                    f"ResourceVersion in object meta: {cur_meta.get('resourceVersion')}",
                )
            grace = options.get("gracePeriodSeconds")
            if (
                info.plural == "pods"
                and self.graceful_pod_deletion
                and grace != 0
                and (cur.get("spec") or {}).get("nodeName")
                and (cur.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
            ):
                if cur_meta.get("deletionTimestamp"):
                    return with_type(info, cur)
                new = deep_copy(cur)
                new["metadata"]["deletionTimestamp"] = _now_rfc3339()
                new["metadata"]["deletionGracePeriodSeconds"] = (
                    grace if grace is not None else cur["spec"].get("terminationGracePeriodSeconds", 30)
                )
                if dry_run:
                    return with_type(info, new)
                new["metadata"]["resourceVersion"] = self._next_rv()
                self._commit(table, "MODIFIED", ns, name, new, cur)
                return with_type(info, new)
            if dry_run:
                return with_type(info, cur)
            final = {**cur, "metadata": {**cur_meta, "resourceVersion": self._next_rv()}}
            self._commit(table, "DELETED", ns, name, final, cur)
            return with_type(info, final)

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
                    if w._selected(o):
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


class _Retry(Exception):
    """Internal: the object changed between read and write of an update without a precondition."""
