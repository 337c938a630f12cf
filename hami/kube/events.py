"""core/v1 Events with client-go's correlation: a repeat bumps ``count`` instead of a new object.

Why here and not in each server: the extender, the device plugin and the webhook all report to users
through events, and all need the same message cut (events.k8s.io rejects notes over 1 KiB), the same
repeat counting (``patch`` on events) and the same rule that an event is best effort: a refused event
is logged, never raised into the request that caused it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any, NamedTuple, Protocol

from hami.errors import HamiError, InvalidRequest
from hami.kube.resources import meta_of, now_rfc3339

log = logging.getLogger(__name__)

#: Event messages longer than this are cut (events.k8s.io/v1 rejects notes over 1 KiB).
EVENT_MESSAGE_MAX = 1024
#: Distinct (object, reason, message) keys remembered for repeat counting.
EVENT_LOG_SIZE = 4096


class _Writer(Protocol):
    def create(self, resource: str, obj: Mapping[str, Any], *, namespace: str | None = None) -> dict: ...

    def patch(self, resource: str, name: str, patch: Any, **kwargs: Any) -> dict: ...


class EventLog:
    """The events recorded lately: key -> (event name, namespace, count, monotonic time of last)."""

    def __init__(self, dedup_s: float) -> None:
        self.dedup_s = dedup_s
        self._seen: OrderedDict[tuple[str, ...], tuple[str, str, int, float]] = OrderedDict()
        self._lock = threading.Lock()

    def repeat(self, key: tuple[str, ...]) -> tuple[str, int]:
        """(name of the event to bump, its new count) for a repeat within `dedup_s`, else ("", 1)."""
        with self._lock:
            seen = self._seen.get(key)
            if seen is not None and time.monotonic() - seen[3] < self.dedup_s:
                self._seen[key] = (seen[0], seen[1], seen[2] + 1, time.monotonic())
                self._seen.move_to_end(key)
                return seen[0], seen[2] + 1
            return "", 1

    def remember(self, key: tuple[str, ...], name: str, namespace: str) -> None:
        with self._lock:
            self._seen[key] = (name, namespace, 1, time.monotonic())
            while len(self._seen) > EVENT_LOG_SIZE:
                self._seen.popitem(last=False)

    def forget(self, key: tuple[str, ...]) -> None:
        with self._lock:
            self._seen.pop(key, None)


class _Event(NamedTuple):
    """One event write as `_event_write` plans it: bump `name` (a repeat) or create `body`."""

    key: tuple[str, ...]
    namespace: str
    name: str
    count: int
    body: dict[str, Any] | None
    now: str


def _event_write(
    events: EventLog,
    involved: Mapping[str, Any],
    *,
    reason: str,
    message: str,
    type: str,
    kind: str | None,
    component: str,
    host: str | None,
    action: str | None,
    namespace: str | None,
) -> _Event:
    if type not in ("Normal", "Warning"):
        raise InvalidRequest(f"event type {type!r}: want 'Normal' or 'Warning'")
    meta = meta_of(involved)
    obj_ns = meta.get("namespace") or ""
    kind = kind or involved.get("kind") or ("Pod" if obj_ns else "Node")
    ns = namespace or obj_ns or "default"
    if len(message) > EVENT_MESSAGE_MAX:
        message = message[: EVENT_MESSAGE_MAX - 3] + "..."
    now = now_rfc3339()
    key = (ns, kind, obj_ns, meta.get("name", ""), meta.get("uid", ""), reason, message, type, component)
    name, count = events.repeat(key)
    if name:
        return _Event(key, ns, name, count, None, now)
    event: dict[str, Any] = {
        "metadata": {"name": f"{meta.get('name', 'object')}.{time.time_ns():x}", "namespace": ns},
        "involvedObject": {
            "kind": kind,
            "apiVersion": involved.get("apiVersion") or "v1",
            "name": meta.get("name", ""),
            **({"namespace": obj_ns} if obj_ns else {}),
            **({"uid": meta["uid"]} if meta.get("uid") else {}),
            **({"resourceVersion": meta["resourceVersion"]} if meta.get("resourceVersion") else {}),
        },
        "reason": reason,
        "message": message,
        "type": type,
        "source": {"component": component, **({"host": host} if host else {})},
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
        "reportingComponent": component,
        "reportingInstance": host or "",
    }
    if action:
        event["action"] = action
    return _Event(key, ns, "", 1, event, now)


def _not_recorded(events: EventLog, plan: _Event, e: HamiError) -> None:
    _ns, kind, obj_ns, name, _uid, reason = plan.key[:6]
    log.warning("event %s on %s %s/%s not recorded: %s", reason, kind, obj_ns, name, e)
    events.forget(plan.key)


def record_event(
    client: _Writer,
    events: EventLog,
    involved: Mapping[str, Any],
    *,
    reason: str,
    message: str,
    type: str = "Normal",
    kind: str | None = None,
    component: str = "hami-scheduler",
    host: str | None = None,
    action: str | None = None,
    namespace: str | None = None,
) -> dict[str, Any] | None:
    """Record a core/v1 Event about `involved`; see `hami.kube.KubeClient.create_event`."""
    plan = _event_write(
        events, involved, reason=reason, message=message, type=type, kind=kind, component=component,
        host=host, action=action, namespace=namespace,
    )  # fmt: skip
    try:
        if plan.body is None:
            return client.patch(
                "events", plan.name, {"count": plan.count, "lastTimestamp": plan.now}, namespace=plan.namespace,
                retry_conflict=True,
            )  # fmt: skip
        created = client.create("events", plan.body, namespace=plan.namespace)
        events.remember(plan.key, created["metadata"]["name"], plan.namespace)
        return created
    except HamiError as e:
        _not_recorded(events, plan, e)
        return None


async def arecord_event(
    client: Any,
    events: EventLog,
    involved: Mapping[str, Any],
    *,
    reason: str,
    message: str,
    type: str = "Normal",
    kind: str | None = None,
    component: str = "hami-scheduler",
    host: str | None = None,
    action: str | None = None,
    namespace: str | None = None,
) -> dict[str, Any] | None:
    """`record_event` through the client's coroutines (``apatch``/``acreate``)."""
    plan = _event_write(
        events, involved, reason=reason, message=message, type=type, kind=kind, component=component,
        host=host, action=action, namespace=namespace,
    )  # fmt: skip
    try:
        if plan.body is None:
            return await client.apatch(
                "events", plan.name, {"count": plan.count, "lastTimestamp": plan.now}, namespace=plan.namespace,
                retry_conflict=True,
            )  # fmt: skip
        created = await client.acreate("events", plan.body, namespace=plan.namespace)
        events.remember(plan.key, created["metadata"]["name"], plan.namespace)
        return created
    except HamiError as e:
        _not_recorded(events, plan, e)
        return None
