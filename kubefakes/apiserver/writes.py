"""The store's write verbs: create, update, patch (three formats), bind, delete.

A mixin of `Store` (kept apart so each file reads on its own): preconditions, the main/status split,
no-op writes, generateName, graceful pod deletion. Called with JSON bodies from the HTTP layer.
"""

from __future__ import annotations

import json
import random
import uuid
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from kubefakes.apiserver.patches import (
    PatchError,
    deep_copy,
    json_patch,
    merge_patch,
    strategic_merge_patch,
)
from kubefakes.apiserver.resources import (
    JSON_PATCH,
    MERGE_PATCH,
    STRATEGIC_MERGE_PATCH,
    ResourceInfo,
    object_meta,
    with_type,
)
from kubefakes.apiserver.status import (
    STALE,
    ApiStatusError,
    already_exists,
    bad_request,
    check_uid_precondition,
    conflict,
    invalid,
    not_found,
    status_body,
)
from kubefakes.apiserver.validation import (
    _validate,
)

if TYPE_CHECKING:
    from kubefakes.apiserver.table import Table


def _now_rfc3339() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def strip_rv(obj: Mapping[str, Any]) -> dict[str, Any]:
    meta = dict(object_meta(obj))
    meta.pop("resourceVersion", None)
    return {**obj, "metadata": meta}


#: The metadata a /status write cannot change: identity and creation fields never change on update, and
#: podStatusStrategy.PrepareForUpdate keeps the stored deletionTimestamp (and ownerReferences, added
#: for pods where it is used).
_STATUS_KEEPS = (
    "name",
    "namespace",
    "uid",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "generateName",
)


class _Retry(Exception):
    """Internal: the object changed between read and write of an update without a precondition."""


class StoreWrites:
    """Write verbs of `Store` (uses its lock, tables and `_commit`)."""

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
            # /status changes the status and the labels and annotations too: kube-apiserver's status
            # strategies of these core resources keep only the stored spec (podStatusStrategy also the
            # deletionTimestamp and ownerReferences), so the spec here comes from the stored object.
            status = new.get("status", cur.get("status"))
            keeps = (*_STATUS_KEEPS, "ownerReferences") if info.plural == "pods" else _STATUS_KEEPS
            kept = {k: cur_meta[k] for k in keeps if k in cur_meta}
            fresh = {k: v for k, v in meta.items() if k not in keeps and k != "resourceVersion"}
            meta = {**fresh, **kept, "resourceVersion": cur_meta.get("resourceVersion")}
            new = {**cur, "metadata": meta, "status": status}
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
            if strip_rv(new) == strip_rv(cur):
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
