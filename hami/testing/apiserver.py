"""An in-memory Kubernetes API server that the official `kubernetes` Python client talks to over HTTP.

Why it exists: no real kube-apiserver can run where this project is tested, yet the extender, the
device plugin and the webhook must be tested against the real client library and the real wire
behaviour (list + watch with resourceVersion, bookmarks, ``410 Gone``, optimistic concurrency, the
three patch formats, the Binding subresource). This server reproduces that behaviour for the
resources the project uses:

* core/v1: ``nodes`` (+``/status``), ``pods`` (+``/status``, ``/binding``), ``bindings``, ``events``,
  ``resourcequotas`` (+``/status``), ``namespaces`` (+``/status``);
* coordination.k8s.io/v1: ``leases``.

Faithful points (each is what kube-apiserver does): one global, increasing resourceVersion; list
answers carry ``metadata.resourceVersion`` and items without ``kind``/``apiVersion``; PUT or a patch
carrying a stale ``metadata.resourceVersion`` is ``409 Conflict``; a write that changes nothing is a
no-op (no new resourceVersion, no event); the main resource ignores ``status`` and ``/status``
ignores everything but ``status`` (pods, nodes, resourcequotas); pod create drops the request's
status (phase ``Pending``) and defaults ``schedulerName``; watch from a resourceVersion older than the
bounded event history answers an ``ERROR`` event with a ``410 Expired`` Status; watches with
selectors see ``DELETED``/``ADDED`` when an object leaves/enters the selection; every error body is a
``Status`` shaped like the real server's (message, reason, details, code).

Not implemented (not used by the project): protobuf/CBOR, server-side apply, authn/authz, admission
webhooks, garbage collection, managedFields, pagination consistency across pages.

Cost model: get/create/update/patch/delete are O(1) in the number of stored objects plus the object
size; a watch event costs O(watchers of that resource); lists are O(objects listed), and
``spec.nodeName=<node>`` pod lists use an index. The event history is bounded per resource.

Use in tests: `FakeApiServer` (background thread, ``.url``, ``.kubeconfig_path``, ``.store`` for
seeding and assertions, ``.faults`` for injected errors). From a shell:
``python -m hami.testing.apiserver --port 0 --kubeconfig-out /tmp/kubeconfig``.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import bisect
import json
import logging
import os
import random
import re
import string
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from aiohttp import web

from hami.testing.patches import PatchError, deep_copy, json_patch, merge_patch, strategic_merge_patch
from hami.testing.selectors import (
    SelectorError,
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
_BY_GROUP: dict[tuple[str, str], dict[str, ResourceInfo]] = {}
for _r in RESOURCES.values():
    _BY_GROUP.setdefault((_r.group, _r.version), {})[_r.plural] = _r

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


def _details(info: ResourceInfo, name: str, **extra: Any) -> dict[str, Any]:
    d: dict[str, Any] = {"name": name}
    if info.group:
        d["group"] = info.group
    d["kind"] = info.plural
    d.update(extra)
    return d


def not_found(info: ResourceInfo, name: str) -> ApiStatusError:
    return ApiStatusError(
        404, status_body(404, f'{info.qualified} "{name}" not found', details=_details(info, name))
    )


def already_exists(info: ResourceInfo, name: str) -> ApiStatusError:
    return ApiStatusError(
        409,
        status_body(
            409,
            f'{info.qualified} "{name}" already exists',
            reason="AlreadyExists",
            details=_details(info, name),
        ),
    )


def conflict(info: ResourceInfo, name: str, why: str, *, qualified: str | None = None) -> ApiStatusError:
    q = qualified or info.qualified
    details = {"name": name, **({"group": info.group} if info.group else {}), "kind": q.split(".")[0]}
    return ApiStatusError(
        409, status_body(409, f'Operation cannot be fulfilled on {q} "{name}": {why}', details=details)
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
    return ApiStatusError(422, status_body(422, f'{info.qualified_kind} "{name}" is invalid: {text}', details=details))


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
                f'Invalid value: "{key}": name part must consist of alphanumeric characters, \'-\', \'_\' '
                "or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or "
                "'my.name',  or '123-abc', regex used for validation is "
                "'([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]') and must be no more than 63 characters",
            )
        ]
    return []


def _validate(info: ResourceInfo, obj: dict[str, Any]) -> None:
    meta = obj.get("metadata")
    if not isinstance(meta, dict):
        raise bad_request(f"{info.kind} in version \"{info.version}\" cannot be handled as a {info.kind}: "
                          "metadata must be an object")
    name = meta.get("name") or ""
    causes: list[tuple[str, str, str]] = []
    if not name:
        causes.append(("metadata.name", "FieldValueRequired", "Required value: name or generateName is required"))
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
                    ("metadata.annotations", "FieldValueTooLong", f"Too long: must have at most {_MAX_ANNOTATIONS_BYTES} bytes")
                )
    if causes:
        raise invalid(info, name, causes)


# ---------------------------------------------------------------------------------------------------
# Store


def _now_rfc3339() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _with_type(info: ResourceInfo, obj: dict[str, Any]) -> dict[str, Any]:
    """Objects are stored without kind/apiVersion (list items have none); single answers get them."""
    return {"kind": info.kind, "apiVersion": info.api_version, **obj}


def _meta(obj: Mapping[str, Any]) -> dict[str, Any]:
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
            cached = json.dumps({"type": type_, "object": _with_type(info, self.obj)}).encode() + b"\n"
            self._lines[type_] = cached
        return cached


_CLOSE = object()
_ABORT = object()


class _Watcher:
    """One open watch: its filter and an asyncio queue of ready-to-send lines (owned by the loop)."""

    def __init__(
        self,
        table: _Table,
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
        if self.namespace is not None and _meta(obj).get("namespace") != self.namespace:
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


class _Table:
    def __init__(self, info: ResourceInfo) -> None:
        self.info = info
        self.objects: dict[str, dict[str, dict[str, Any]]] = {}  # namespace ("" if cluster) -> name -> obj
        self.by_node: dict[str, dict[tuple[str, str], None]] = {}  # pods only: spec.nodeName -> keys
        self.history: list[_Event] = []
        self.compacted_rv = 0
        self.watchers: set[_Watcher] = set()
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
    meta = dict(_meta(obj))
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
        self._tables = {plural: _Table(info) for plural, info in RESOURCES.items()}
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
            return deep_copy(_with_type(table.info, obj)) if obj is not None else None

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
        return [deep_copy(_with_type(self._tables[resource].info, o)) for o in items]

    def create(
        self, resource: str, obj: Mapping[str, Any], *, namespace: str | None = None, keep_status: bool = True
    ) -> dict[str, Any]:
        """Create an object (test seeding). Unlike the HTTP API, a pod's status is kept by default."""
        table = self._table(resource)
        ns = namespace if namespace is not None else _meta(obj).get("namespace")
        return deep_copy(self.do_create(table, self._ns(table, ns), deep_copy(dict(obj)), keep_status=keep_status))

    def update(self, resource: str, obj: Mapping[str, Any], *, subresource: str | None = None) -> dict[str, Any]:
        """Replace an object (PUT semantics, incl. the resourceVersion check if the object has one)."""
        table = self._table(resource)
        meta = _meta(obj)
        return deep_copy(
            self.do_update(
                table, self._ns(table, meta.get("namespace")), meta.get("name", ""), deep_copy(dict(obj)), subresource
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
        return deep_copy(self.do_patch(table, self._ns(table, namespace), name, patch, patch_type, subresource))

    def delete(self, resource: str, name: str, *, namespace: str | None = None) -> dict[str, Any]:
        """Delete an object at once (grace period 0)."""
        table = self._table(resource)
        return deep_copy(self.do_delete(table, self._ns(table, namespace), name, {"gracePeriodSeconds": 0}))

    def set_pod_phase(self, namespace: str, name: str, phase: str) -> dict[str, Any]:
        """Convenience for tests: merge-patch ``status.phase`` through the status subresource."""
        return self.patch("pods", name, {"status": {"phase": phase}}, namespace=namespace, subresource="status")

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

    def _table(self, resource: str) -> _Table:
        try:
            return self._tables[resource]
        except KeyError:
            raise ValueError(f"resource {resource!r}: want one of {sorted(self._tables)}") from None

    @staticmethod
    def _ns(table: _Table, namespace: str | None) -> str:
        if not table.info.namespaced:
            return ""
        return namespace or "default"

    def _commit(self, table: _Table, type_: str, ns: str, name: str, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
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

    def _deliver_later(self, table: _Table, ev: _Event) -> None:
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
            parse_label_selector(label_selector), parse_field_selector(field_selector, table.info.field_labels)
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
        items.sort(key=lambda o: (_meta(o).get("namespace", ""), _meta(o).get("name", "")))
        return items, rv

    def get_object(self, table: _Table, ns: str, name: str) -> dict[str, Any]:
        with self._lock:
            obj = table.get(ns, name)
        if obj is None:
            raise not_found(table.info, name)
        return obj

    def do_create(
        self, table: _Table, ns: str, obj: dict[str, Any], *, keep_status: bool = False, dry_run: bool = False
    ) -> dict[str, Any]:
        info = table.info
        if not isinstance(obj, dict):
            raise bad_request(f"{info.kind} in version \"{info.version}\" cannot be handled as a {info.kind}")
        obj.pop("kind", None)
        obj.pop("apiVersion", None)
        meta = obj.setdefault("metadata", {})
        if not isinstance(meta, dict):
            raise bad_request("metadata must be an object")
        if info.namespaced:
            if meta.get("namespace") and meta["namespace"] != ns:
                raise bad_request("the namespace of the provided object does not match the namespace sent on the request")
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
                return _with_type(info, obj)
            meta["resourceVersion"] = self._next_rv()
            self._commit(table, "ADDED", ns, name, obj, None)
        return _with_type(info, obj)

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
        table: _Table,
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
            raise bad_request(f"{info.kind} in version \"{info.version}\" cannot be handled as a {info.kind}")
        new.pop("kind", None)
        new.pop("apiVersion", None)
        meta = new["metadata"]
        cur_meta = _meta(cur)
        if meta.get("name", name) != name:
            raise bad_request(f"the name of the object ({meta.get('name')}) does not match the name on the URL ({name})")
        if info.namespaced and meta.get("namespace", ns) != ns:
            raise bad_request("the namespace of the provided object does not match the namespace sent on the request")
        wanted_rv = meta.get("resourceVersion")
        if wanted_rv not in (None, "") and str(wanted_rv) != cur_meta.get("resourceVersion"):
            raise conflict(info, name, STALE)
        uid = meta.get("uid")
        if uid and uid != cur_meta.get("uid"):
            raise conflict(info, name, f"Precondition failed: UID in precondition: {uid}, UID in object meta: {cur_meta.get('uid')}")
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
            for k in ("uid", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds", "generateName"):
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
                    [("spec", "FieldValueForbidden", "Forbidden: pod updates may not change fields other than "
                      "`spec.containers[*].image`,`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,"
                      "`spec.tolerations` (only additions to existing tolerations),"
                      "`spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was previously negative)")],
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
                return _with_type(info, cur)  # a no-op write: no new resourceVersion, no event
            if dry_run:
                return _with_type(info, new)
            new.setdefault("metadata", {})["resourceVersion"] = self._next_rv()
            self._commit(table, "MODIFIED", ns, name, new, cur)
        return _with_type(info, new)

    def do_update(
        self, table: _Table, ns: str, name: str, body: Any, subresource: str | None, dry_run: bool = False
    ) -> dict[str, Any]:
        while True:
            cur = self.get_object(table, ns, name)
            try:
                return self._finish_write(table, ns, name, cur, deep_copy(body), subresource, dry_run)
            except _Retry:
                continue

    def do_patch(
        self,
        table: _Table,
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
            base = _with_type(info, cur)
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
                        status_body(415, f"the body of the request was in an unknown format - accepted media types include: "
                                    f"{JSON_PATCH}, {MERGE_PATCH}, {STRATEGIC_MERGE_PATCH}, application/apply-patch+yaml"),
                    )
            except PatchError as e:
                if e.invalid:
                    raise invalid(info, name, [("patch", "FieldValueInvalid", f"Invalid value: {json.dumps(patch)!r}: {e}")]) from None
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
            raise bad_request("Binding in version \"v1\" cannot be handled as a Binding")
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
            cur_meta = _meta(cur)
            if meta.get("uid") and meta["uid"] != cur_meta.get("uid"):
                raise conflict(
                    info,
                    pod_name,
                    f"Precondition failed: UID in precondition: {meta['uid']}, UID in object meta: {cur_meta.get('uid')}",
                )
            if meta.get("resourceVersion") and meta["resourceVersion"] != cur_meta.get("resourceVersion"):
                raise conflict(info, pod_name, STALE)
            if cur_meta.get("deletionTimestamp"):
                raise conflict(
                    info, pod_name, f"pod {pod_name} is being deleted, cannot be assigned to a host", qualified="pods/binding"
                )
            bound = (cur.get("spec") or {}).get("nodeName")
            if bound:
                raise conflict(
                    info, pod_name, f'pod {pod_name} is already assigned to node "{bound}"', qualified="pods/binding"
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
                {"type": "PodScheduled", "status": "True", "lastProbeTime": None, "lastTransitionTime": _now_rfc3339()}
            )
            status["conditions"] = conditions
            new["metadata"]["resourceVersion"] = self._next_rv()
            self._commit(table, "MODIFIED", ns, pod_name, new, cur)

    def do_delete(self, table: _Table, ns: str, name: str, options: Any, dry_run: bool = False) -> dict[str, Any]:
        info = table.info
        options = options if isinstance(options, dict) else {}
        pre = options.get("preconditions") or {}
        with self._lock:
            cur = table.get(ns, name)
            if cur is None:
                raise not_found(info, name)
            cur_meta = _meta(cur)
            if pre.get("uid") and pre["uid"] != cur_meta.get("uid"):
                raise conflict(
                    info, name, f"Precondition failed: UID in precondition: {pre['uid']}, UID in object meta: {cur_meta.get('uid')}"
                )
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
                    return _with_type(info, cur)
                new = deep_copy(cur)
                new["metadata"]["deletionTimestamp"] = _now_rfc3339()
                new["metadata"]["deletionGracePeriodSeconds"] = (
                    grace if grace is not None else cur["spec"].get("terminationGracePeriodSeconds", 30)
                )
                if dry_run:
                    return _with_type(info, new)
                new["metadata"]["resourceVersion"] = self._next_rv()
                self._commit(table, "MODIFIED", ns, name, new, cur)
                return _with_type(info, new)
            if dry_run:
                return _with_type(info, cur)
            final = {**cur, "metadata": {**cur_meta, "resourceVersion": self._next_rv()}}
            self._commit(table, "DELETED", ns, name, final, cur)
            return _with_type(info, final)

    def open_watch(
        self,
        table: _Table,
        namespace: str | None,
        matcher: Callable[[Mapping[str, Any]], bool] | None,
        resource_version: str | None,
        send_initial_events: bool | None,
    ) -> tuple[_Watcher, list[bytes]]:
        """Register a watcher (on the loop thread) and return it with its first lines to send.

        Raises ApiStatusError 410 when `resource_version` is older than the retained history.
        """
        info = table.info
        with self._lock:
            current = self._rv
            w = _Watcher(table, namespace, matcher, current)
            lines: list[bytes] = []
            if resource_version in (None, "", "0") or send_initial_events:
                # "Get state and start at most recent": synthetic ADDED for everything that exists.
                objs = table.iter_objects(namespace if info.namespaced else None)
                for o in objs:
                    if w._selected(o):
                        lines.append(json.dumps({"type": "ADDED", "object": _with_type(info, o)}).encode() + b"\n")
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

    def close_watch(self, w: _Watcher) -> None:
        with self._lock:
            w.table.watchers.discard(w)

    def bookmark_rv(self, table: _Table) -> int | None:
        """The rv a bookmark may carry now, or None while events for this table are still in flight."""
        with self._lock:
            return None if table.pending else self._rv

    def all_watchers(self) -> list[_Watcher]:
        with self._lock:
            return [w for t in self._tables.values() for w in t.watchers]


class _Retry(Exception):
    """Internal: the object changed between read and write of an update without a precondition."""


# ---------------------------------------------------------------------------------------------------
# Fault injection


@dataclass
class Fault:
    """Make the next `times` matching requests fail or stall.

    Matching: `verb` is a Kubernetes verb (get, list, watch, create, update, patch, delete) or an HTTP
    method (GET, POST, ...); `resource` a plural (``pods``); `subresource` (``binding``, ``status``; None
    matches any, ``""`` only the main resource); `name`/`namespace`; `path` a regex searched in the URL
    path. Unset fields match anything.
    Effect: wait `delay_s` (with `status` None the request then proceeds normally), then answer
    `status` with a Status body (and ``Retry-After`` for 429), or stall for `hang_s` and answer 504.
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
    hits: int = 0

    def matches(self, verb: str, method: str, resource: str, subresource: str, name: str, namespace: str, path: str) -> bool:
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


def _fault_status(f: Fault, info: ResourceInfo | None, name: str) -> ApiStatusError:
    code = f.status or 500
    if code == 409 and info is not None:
        err = conflict(info, name, f.message or STALE)
        return err
    if code == 404 and info is not None:
        return not_found(info, name)
    if code == 429:
        return ApiStatusError(
            429,
            status_body(429, f.message or "Too many requests, please try again later.", details={"retryAfterSeconds": f.retry_after_s}),
            {"Retry-After": str(f.retry_after_s)},
        )
    if code == 500:
        msg = f.message or "injected fault"
        return ApiStatusError(
            500, status_body(500, f"Internal error occurred: {msg}", details={"causes": [{"message": msg}]})
        )
    if code == 410:
        return ApiStatusError(410, status_body(410, f.message or "too old resource version", reason="Expired"))
    return ApiStatusError(code, status_body(code, f.message or f"injected {code}"))


# ---------------------------------------------------------------------------------------------------
# HTTP layer


@dataclass
class _Route:
    info: ResourceInfo | None
    namespace: str | None  # None: all namespaces / cluster scope
    name: str
    subresource: str
    watch_prefix: bool = False


def _parse_path(path: str) -> _Route | None:
    parts = [p for p in path.split("/") if p]
    if len(parts) >= 2 and parts[0] == "api" and parts[1] == "v1":
        group, version, rest = "", "v1", parts[2:]
    elif len(parts) >= 3 and parts[0] == "apis":
        group, version, rest = parts[1], parts[2], parts[3:]
    else:
        return None
    resources = _BY_GROUP.get((group, version))
    if resources is None or not rest:
        return None
    watch_prefix = False
    if rest[0] == "watch":
        watch_prefix, rest = True, rest[1:]
    if len(rest) >= 3 and rest[0] == "namespaces" and (rest[2] in resources or (group == "" and rest[2] == "bindings")):
        ns, rest = rest[1], rest[2:]
        if rest[0] == "bindings" and len(rest) == 1:
            return _Route(None, ns, "", "bindings")
        info = resources[rest[0]]
        if not info.namespaced or len(rest) > 3:
            return None
        return _Route(info, ns, rest[1] if len(rest) > 1 else "", rest[2] if len(rest) > 2 else "", watch_prefix)
    info = resources.get(rest[0])
    if info is None or len(rest) > 3:
        return None
    if info.namespaced and len(rest) > 1:
        return None
    return _Route(info, None, rest[1] if len(rest) > 1 else "", rest[2] if len(rest) > 2 else "", watch_prefix)


def _json_response(body: Any, status: int = 200, headers: Mapping[str, str] | None = None) -> web.Response:
    return web.Response(body=json.dumps(body).encode(), status=status, content_type=JSON, headers=headers)


def _truthy(value: str | None) -> bool:
    return value is not None and value.lower() in ("true", "1")


class FakeApiServer:
    """The in-memory API server running on its own thread and event loop.

    ``FakeApiServer().start()`` binds 127.0.0.1 (port 0 = any free port) and writes a kubeconfig;
    ``.url``, ``.kubeconfig_path``, ``.store`` (`Store`), ``.faults`` (`FaultInjector`);
    ``.drop_watches()`` ends every open watch; ``.compact()`` makes older resourceVersions expire;
    ``.stop()`` shuts it down. Also usable as a context manager.

    `bookmark_interval_s`: how often a watch with ``allowWatchBookmarks`` gets a BOOKMARK (the real
    server: about a minute; tests want less). `default_watch_timeout_s`: used when the client sends no
    ``timeoutSeconds`` (the real server picks 30-60 minutes).
    """

    def __init__(
        self,
        *,
        port: int = 0,
        host: str = "127.0.0.1",
        history_size: int = 10000,
        bookmark_interval_s: float = 1.0,
        default_watch_timeout_s: float = 1800.0,
        graceful_pod_deletion: bool = False,
        kubeconfig_path: str | None = None,
    ) -> None:
        self.host = host
        self.port = port
        self.store = Store(history_size=history_size, graceful_pod_deletion=graceful_pod_deletion)
        self.faults = FaultInjector()
        self.bookmark_interval_s = bookmark_interval_s
        self.default_watch_timeout_s = default_watch_timeout_s
        self.kubeconfig_path = kubeconfig_path
        self.request_count = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None
        self._tmpdir: tempfile.TemporaryDirectory[str] | None = None
        self._tasks: set[asyncio.Task[Any]] = set()

    # -- lifecycle ---------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> FakeApiServer:
        """Start serving in a daemon thread; returns self once the port is bound."""
        ready = threading.Event()
        error: list[BaseException] = []

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            asyncio.set_event_loop(loop)
            try:
                loop.run_until_complete(self._start_async())
            except BaseException as e:  # noqa: BLE001 - reported to the starting thread
                error.append(e)
                ready.set()
                return
            ready.set()
            loop.run_forever()
            loop.run_until_complete(self._stop_async())
            loop.close()

        self._thread = threading.Thread(target=run, name="fake-apiserver", daemon=True)
        self._thread.start()
        ready.wait()
        if error:
            raise error[0]
        if self.kubeconfig_path is None:
            self._tmpdir = tempfile.TemporaryDirectory(prefix="fake-apiserver-")
            self.kubeconfig_path = os.path.join(self._tmpdir.name, "kubeconfig")
        write_kubeconfig(self.url, self.kubeconfig_path)
        return self

    async def _start_async(self) -> None:
        self.store._loop = asyncio.get_running_loop()
        self.store._loop_thread = threading.get_ident()
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port, reuse_address=True)
        await site.start()
        sockets = site._server.sockets if site._server else []  # noqa: SLF001 - the bound port for port 0
        self.port = sockets[0].getsockname()[1]

    async def _stop_async(self) -> None:
        for w in self.store.all_watchers():
            w.queue.put_nowait(_CLOSE)
        for t in list(self._tasks):
            t.cancel()
        if self._runner is not None:
            await self._runner.cleanup()

    def stop(self) -> None:
        """Stop serving and join the thread (idempotent)."""
        if self._loop is not None and self._thread is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
        self.store._loop = None
        if self._tmpdir is not None:
            self._tmpdir.cleanup()
            self._tmpdir = None

    def __enter__(self) -> FakeApiServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- test hooks --------------------------------------------------------------------------------

    def drop_watches(self, *, abrupt: bool = False) -> int:
        """End every open watch: cleanly (end of stream) or `abrupt` (connection reset). Returns count."""
        watchers = self.store.all_watchers()
        if self._loop is not None:
            marker = _ABORT if abrupt else _CLOSE
            for w in watchers:
                self._loop.call_soon_threadsafe(w.queue.put_nowait, marker)
        return len(watchers)

    def compact(self) -> None:
        """Forget the event history (a watch from an older resourceVersion now gets 410 Expired)."""
        self.store.compact()

    def open_watch_count(self, resource: str | None = None) -> int:
        """Open watches, of one resource or all."""
        return len([w for w in self.store.all_watchers() if resource is None or w.table.info.plural == resource])

    # -- HTTP --------------------------------------------------------------------------------------

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        self.request_count += 1
        try:
            return await self._dispatch(request)
        except ApiStatusError as e:
            return _json_response(e.body, e.code, e.headers)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - a fake server bug must answer 500, not hang the client
            log.exception("fake apiserver: %s %s failed", request.method, request.path)
            return _json_response(status_body(500, f"Internal error occurred: {e}"), 500)

    async def _dispatch(self, request: web.Request) -> web.StreamResponse:
        path = request.path
        if path in ("/healthz", "/readyz", "/livez"):
            return web.Response(text="ok")
        if path == "/version":
            return _json_response(
                {"major": "1", "minor": "33", "gitVersion": "v1.33.0-hami-fake", "platform": "linux/amd64"}
            )
        if path == "/api":
            return _json_response({"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []})
        if path == "/apis":
            return _json_response(
                {
                    "kind": "APIGroupList",
                    "apiVersion": "v1",
                    "groups": [
                        {
                            "name": g,
                            "versions": [{"groupVersion": f"{g}/{v}", "version": v}],
                            "preferredVersion": {"groupVersion": f"{g}/{v}", "version": v},
                        }
                        for (g, v) in _BY_GROUP
                        if g
                    ],
                }
            )
        route = _parse_path(path)
        if route is None:
            return self._discovery(path) or _json_response(
                status_body(404, "the server could not find the requested resource", details={}), 404
            )
        q = request.query
        method = request.method
        watch = route.watch_prefix or _truthy(q.get("watch"))
        verb = {
            "GET": "watch" if watch else ("get" if route.name else "list"),
            "POST": "create",
            "PUT": "update",
            "PATCH": "patch",
            "DELETE": "delete" if route.name else "deletecollection",
        }.get(method, method.lower())
        info = route.info
        fault = self.faults.take(
            verb, method, info.plural if info else "bindings", route.subresource, route.name, route.namespace or "", path
        )
        if fault is not None:
            if fault.delay_s:
                await asyncio.sleep(fault.delay_s)
            if fault.hang_s is not None:
                await asyncio.sleep(fault.hang_s)
                raise ApiStatusError(504, status_body(504, "Timeout: request did not complete within requested timeout"))
            if fault.status is not None:
                raise _fault_status(fault, info, route.name)
        dry_run = q.get("dryRun") == "All"
        if info is None:  # POST /api/v1/namespaces/{ns}/bindings
            if method != "POST":
                raise ApiStatusError(405, status_body(405, f"the server does not allow this method on the requested resource"))
            body = await self._body(request)
            name = ((body or {}).get("metadata") or {}).get("name", "") if isinstance(body, dict) else ""
            self.store.do_bind(route.namespace or "default", name, body, dry_run)
            return _json_response({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}, 201)
        table = self.store._tables[info.plural]
        ns = (route.namespace or "default") if info.namespaced else ""
        sub = route.subresource
        if sub and not (sub == "status" and info.status_subresource) and not (sub == "binding" and info.plural == "pods"):
            raise ApiStatusError(404, status_body(404, "the server could not find the requested resource", details={}))
        if not route.name:
            if method == "GET":
                if watch:
                    return await self._watch(request, table, route.namespace if info.namespaced else None)
                return self._list(table, route.namespace if info.namespaced else None, q)
            if method == "POST":
                if info.namespaced and route.namespace is None:
                    raise ApiStatusError(405, status_body(405, "the server does not allow this method on the requested resource"))
                return _json_response(self.store.do_create(table, ns, await self._body(request), dry_run=dry_run), 201)
            raise ApiStatusError(405, status_body(405, "the server does not allow this method on the requested resource"))
        if sub == "binding":
            if method != "POST":
                raise ApiStatusError(405, status_body(405, "the server does not allow this method on the requested resource"))
            self.store.do_bind(ns, route.name, await self._body(request), dry_run)
            return _json_response({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}, 201)
        if method == "GET":
            return _json_response(_with_type(info, self.store.get_object(table, ns, route.name)))
        if method == "PUT":
            body = await self._body(request)
            return _json_response(self.store.do_update(table, ns, route.name, body, sub or None, dry_run))
        if method == "PATCH":
            ctype = request.content_type
            body = await self._body(request)
            return _json_response(self.store.do_patch(table, ns, route.name, body, ctype, sub or None, dry_run))
        if method == "DELETE":
            options = await self._body(request, optional=True)
            if "gracePeriodSeconds" in q:
                options = {**(options or {}), "gracePeriodSeconds": int(q["gracePeriodSeconds"])}
            obj = self.store.do_delete(table, ns, route.name, options, dry_run)
            if info.plural in ("pods", "namespaces"):
                return _json_response(obj)
            details = _details(info, route.name, uid=_meta(obj).get("uid"))
            return _json_response(
                {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "details": details}
            )
        raise ApiStatusError(405, status_body(405, "the server does not allow this method on the requested resource"))

    @staticmethod
    async def _body(request: web.Request, *, optional: bool = False) -> Any:
        raw = await request.read()
        if not raw:
            if optional:
                return None
            raise bad_request("the body of the request is empty")
        try:
            return json.loads(raw)
        except ValueError as e:
            raise bad_request(f"error decoding request body: {e}") from None

    @staticmethod
    def _discovery(path: str) -> web.Response | None:
        parts = [p for p in path.split("/") if p]
        if parts == ["api", "v1"]:
            group, version = "", "v1"
        elif len(parts) == 3 and parts[0] == "apis":
            group, version = parts[1], parts[2]
        else:
            return None
        resources = _BY_GROUP.get((group, version))
        if resources is None:
            return None
        return _json_response(
            {
                "kind": "APIResourceList",
                "groupVersion": f"{group}/{version}" if group else version,
                "resources": [
                    {"name": r.plural, "singularName": r.kind.lower(), "namespaced": r.namespaced, "kind": r.kind,
                     "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"]}
                    for r in resources.values()
                ],
            }
        )

    def _list(self, table: _Table, namespace: str | None, q: Mapping[str, str]) -> web.Response:
        info = table.info
        try:
            items, rv = self.store.list_objects(
                info.plural,
                namespace=namespace,
                label_selector=q.get("labelSelector"),
                field_selector=q.get("fieldSelector"),
            )
        except SelectorError as e:
            raise bad_request(str(e)) from None
        wanted = q.get("resourceVersion")
        if wanted and wanted != "0" and q.get("resourceVersionMatch") != "NotOlderThan" or wanted not in (None, "", "0"):
            try:
                wanted_rv = int(wanted or 0)
            except ValueError:
                raise bad_request(f'invalid resource version "{wanted}"') from None
            if wanted_rv > rv:
                raise ApiStatusError(
                    504,
                    status_body(
                        504,
                        f"Too large resource version: {wanted_rv}, current: {rv}",
                        reason="Timeout",
                        details={
                            "causes": [{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}],
                            "retryAfterSeconds": 1,
                        },
                    ),
                )
        meta: dict[str, Any] = {"resourceVersion": str(rv)}
        limit = int(q.get("limit") or 0)
        cont = q.get("continue")
        if cont:
            try:
                token = json.loads(base64.b64decode(cont))
                after = (token["ns"], token["name"])
                meta["resourceVersion"] = str(token["rv"])
            except (ValueError, KeyError, TypeError):
                raise bad_request(f"invalid continue token: {cont!r}") from None
            keys = [(_meta(o).get("namespace", ""), _meta(o).get("name", "")) for o in items]
            items = items[bisect.bisect_right(keys, after) :]
        if limit and len(items) > limit:
            items = items[:limit]
            last = _meta(items[-1])
            token = {"rv": int(meta["resourceVersion"]), "ns": last.get("namespace", ""), "name": last.get("name", "")}
            meta["continue"] = base64.b64encode(json.dumps(token).encode()).decode()
            meta["remainingItemCount"] = 0  # not tracked precisely
        body = {"kind": f"{info.kind}List", "apiVersion": info.api_version, "metadata": meta, "items": items}
        return _json_response(body)

    async def _watch(self, request: web.Request, table: _Table, namespace: str | None) -> web.StreamResponse:
        q = request.query
        info = table.info
        try:
            matcher = compile_matcher(
                parse_label_selector(q.get("labelSelector")),
                parse_field_selector(q.get("fieldSelector"), info.field_labels),
            )
        except SelectorError as e:
            raise bad_request(str(e)) from None
        timeout = float(q.get("timeoutSeconds") or self.default_watch_timeout_s)
        bookmarks = _truthy(q.get("allowWatchBookmarks"))
        send_initial = _truthy(q.get("sendInitialEvents"))
        resp = web.StreamResponse(status=200, headers={"Content-Type": JSON})
        resp.enable_chunked_encoding()
        try:
            watcher, lines = self.store.open_watch(table, namespace, matcher, q.get("resourceVersion"), send_initial)
        except ApiStatusError as e:
            if e.code != 410:
                raise
            # The real server answers 200 and sends the expiry as an ERROR event on the stream.
            await resp.prepare(request)
            await resp.write(json.dumps({"type": "ERROR", "object": e.body}).encode() + b"\n")
            await resp.write_eof()
            return resp
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        try:
            await resp.prepare(request)
            if lines:
                await resp.write(b"".join(lines))
            if send_initial and bookmarks:
                mark = {"kind": info.kind, "apiVersion": info.api_version,
                        "metadata": {"resourceVersion": str(watcher.start_rv),
                                     "annotations": {"k8s.io/initial-events-end": "true"}}}
                await resp.write(json.dumps({"type": "BOOKMARK", "object": mark}).encode() + b"\n")
            loop = asyncio.get_running_loop()
            deadline = loop.time() + timeout
            next_bookmark = loop.time() + self.bookmark_interval_s
            while True:
                now = loop.time()
                if now >= deadline:
                    break
                wait = deadline - now
                if bookmarks:
                    wait = min(wait, max(0.0, next_bookmark - now))
                try:
                    item = await asyncio.wait_for(watcher.queue.get(), timeout=wait)
                except TimeoutError:
                    if bookmarks and loop.time() >= next_bookmark:
                        rv = self.store.bookmark_rv(table)
                        if rv is not None and watcher.queue.empty():
                            mark = {"kind": info.kind, "apiVersion": info.api_version, "metadata": {"resourceVersion": str(rv)}}
                            await resp.write(json.dumps({"type": "BOOKMARK", "object": mark}).encode() + b"\n")
                        next_bookmark = loop.time() + self.bookmark_interval_s
                    continue
                batch = [item]
                while not watcher.queue.empty():
                    batch.append(watcher.queue.get_nowait())
                payload = [b for b in batch if isinstance(b, bytes)]
                if payload:
                    await resp.write(b"".join(payload))
                if any(b is _ABORT for b in batch):
                    if request.transport is not None:
                        request.transport.abort()
                    return resp
                if any(b is _CLOSE for b in batch):
                    break
            await resp.write_eof()
        except (ConnectionResetError, ConnectionError):
            pass
        finally:
            self.store.close_watch(watcher)
            if task is not None:
                self._tasks.discard(task)
        return resp


def write_kubeconfig(url: str, path: str, *, namespace: str = "default") -> str:
    """Write a kubeconfig (YAML-compatible JSON) pointing at `url` with a dummy token; returns `path`."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "fake", "cluster": {"server": url}}],
        "users": [{"name": "fake", "user": {"token": "fake-token"}}],
        "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake", "namespace": namespace}}],
        "current-context": "fake",
        "preferences": {},
    }
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2)
    os.replace(tmp, path)
    return path


def main(argv: list[str] | None = None) -> int:
    """``python -m hami.testing.apiserver --port 0 --kubeconfig-out F``: serve until interrupted."""
    parser = argparse.ArgumentParser(prog="python -m hami.testing.apiserver", description=__doc__.split("\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 = any free port")
    parser.add_argument("--kubeconfig-out", help="write a kubeconfig for this server to this file")
    parser.add_argument("--history-size", type=int, default=10000, help="watch events kept per resource")
    parser.add_argument("--bookmark-interval", type=float, default=1.0, help="seconds between watch bookmarks")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    server = FakeApiServer(
        host=args.host,
        port=args.port,
        history_size=args.history_size,
        bookmark_interval_s=args.bookmark_interval,
        kubeconfig_path=args.kubeconfig_out,
    )
    server.start()
    print(server.url, flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

__all__ = [
    "ApiStatusError",
    "Fault",
    "FaultInjector",
    "FakeApiServer",
    "RESOURCES",
    "ResourceInfo",
    "Store",
    "status_body",
    "write_kubeconfig",
    "main",
    "field",
    "string",
]
