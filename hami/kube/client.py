"""`KubeClient`: the project's only door to the Kubernetes API server (the official `kubernetes` client).

Why one module: every server here (extender, device plugin, webhook) needs the same few calls, the
same retry policy and the same error mapping, and the client library has sharp edges that should be
handled once:

* Objects are plain dicts in the API's JSON form, never the generated model classes: every call uses
  ``_preload_content=False`` and orjson (much faster for thousands of pods, and it avoids the
  client's known failure to deserialise the ``Status`` a successful Binding returns as a ``V1Binding``,
  kubernetes-client/python#547).
* get / create / patch / Binding (the calls a scheduler makes per pod) go straight to the client's
  ``ApiClient.rest_client`` urllib3 pool with the same URL, headers and auth
  (`hami.kube.transport.ApiTransport`, which sends what the verbs here build);
  the generated methods' argument validation, model sanitisation and per-call host/proxy/token
  look-ups were half of their CPU. List, watch, replace and delete still use the generated methods.
* Retries and error mapping are `hami.kube.retry`'s (429/5xx/transport retried, 409 only without a
  precondition; 404 -> `NotFound`, which getters turn into None).

Methods are synchronous and thread-safe. The hot calls also come as coroutines for asyncio servers
(``aget``, ``apatch``, ``acreate``, ``apatch_pod_metadata``, ``apatch_node_annotations``, ``abind_pod``,
``acreate_event``): the same requests, built by the same code here, sent from the event loop by
`hami.kube.aio.AsyncTransport` (no worker thread per call). Bodies are encoded and answers decoded
with orjson.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from hami.errors import ApiError, Conflict, InvalidRequest, NotFound
from hami.kube.events import EventLog, arecord_event, record_event
from hami.kube.resources import RESOURCES, meta_of, ref
from hami.kube.resources import resource as resource_of
from hami.kube.retry import TRANSPORT_ERRORS, map_api_exception
from hami.kube.transport import AUTH_REFRESH_S, ApiRequest, ApiTransport
from hami.kube.watch import WatchStream

__all__ = ["AUTH_REFRESH_S", "JSON_PATCH", "MERGE_PATCH", "STRATEGIC_MERGE_PATCH", "KubeClient"]

MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
JSON_PATCH = "application/json-patch+json"
_PATCH_TYPES = {"merge": MERGE_PATCH, "strategic": STRATEGIC_MERGE_PATCH, "json": JSON_PATCH}


class KubeClient(ApiTransport):
    """Plain-dict access to the API server with retries and error mapping (see module docstring).

    Construction, rate limit, timeouts and retries: `hami.kube.transport.ApiTransport` (`from_kubeconfig`,
    `in_cluster`, `close`, `aclose`). `event_dedup_s`: repeats of one event within it bump its count.
    """

    def __init__(self, api_client: k8s.ApiClient, *, event_dedup_s: float = 600.0, **options: Any) -> None:
        super().__init__(api_client, **options)
        self.event_dedup_s = event_dedup_s
        self._event_log = EventLog(event_dedup_s)

    # -- generic operations ------------------------------------------------------------------------

    def _get_req(self, resource: str, name: str, namespace: str | None) -> ApiRequest:
        res = resource_of(resource)
        return ApiRequest(f"get {resource} {ref(namespace, name, res)}", "GET", self._path(res, name, namespace))

    def get(self, resource: str, name: str, *, namespace: str | None = None) -> dict[str, Any] | None:
        """GET one object; None when it does not exist (HTTP 404)."""
        try:
            return self._send(self._get_req(resource, name, namespace))
        except NotFound:
            return None

    async def aget(self, resource: str, name: str, *, namespace: str | None = None) -> dict[str, Any] | None:
        """`get` as a coroutine on the running loop."""
        try:
            return await self._asend(self._get_req(resource, name, namespace))
        except NotFound:
            return None

    def _list_method(
        self, res: Any, namespace: str | None, field_selector: str | None, label_selector: str | None
    ) -> tuple[Any, tuple[Any, ...], dict[str, Any]]:
        """The client's list function for `res` (namespaced or all namespaces), its positional
        arguments and the selector keyword arguments; shared by list and watch."""
        kwargs: dict[str, Any] = {}
        if field_selector:
            kwargs["field_selector"] = field_selector
        if label_selector:
            kwargs["label_selector"] = label_selector
        if res.namespaced and namespace is not None:
            return self._method(res, "list"), (namespace,), kwargs
        return self._method(res, "list", all_namespaces=True), (), kwargs

    def list_with_version(
        self,
        resource: str,
        *,
        namespace: str | None = None,
        field_selector: str | None = None,
        label_selector: str | None = None,
    ) -> tuple[list[dict[str, Any]], str]:
        """LIST (all namespaces when `namespace` is None): ``(items, list resourceVersion)``.

        Items are as the server sends them: without ``kind``/``apiVersion``.
        """
        res = resource_of(resource)
        fn, args, kwargs = self._list_method(res, namespace, field_selector, label_selector)
        body = self._call(f"list {resource}", fn, *args, **kwargs) or {}
        return list(body.get("items") or []), str((body.get("metadata") or {}).get("resourceVersion", ""))

    def list(
        self,
        resource: str,
        *,
        namespace: str | None = None,
        field_selector: str | None = None,
        label_selector: str | None = None,
    ) -> list[dict[str, Any]]:
        """LIST; see `list_with_version`."""
        items, _ = self.list_with_version(
            resource, namespace=namespace, field_selector=field_selector, label_selector=label_selector
        )
        return items

    def _create_req(self, resource: str, obj: Mapping[str, Any], namespace: str | None) -> ApiRequest:
        res = resource_of(resource)
        body = {"apiVersion": res.api_version, "kind": res.kind, **obj}
        ns = namespace or meta_of(obj).get("namespace") or "default"
        what = f"create {resource} {ref(ns, meta_of(obj).get('name') or meta_of(obj).get('generateName', ''), res)}"
        return ApiRequest(what, "POST", self._path(res, namespace=ns), body)

    def create(
        self, resource: str, obj: Mapping[str, Any], *, namespace: str | None = None
    ) -> dict[str, Any]:
        """POST a new object; raises Conflict when it already exists, InvalidRequest when invalid."""
        return self._send(self._create_req(resource, obj, namespace))

    async def acreate(
        self, resource: str, obj: Mapping[str, Any], *, namespace: str | None = None
    ) -> dict[str, Any]:
        """`create` as a coroutine on the running loop."""
        return await self._asend(self._create_req(resource, obj, namespace))

    def patch(
        self,
        resource: str,
        name: str,
        patch: Any,
        *,
        namespace: str | None = None,
        patch_type: str = "merge",
        subresource: str | None = None,
        retry_conflict: bool | None = None,
    ) -> dict[str, Any]:
        """PATCH an object: `patch_type` "merge" (RFC 7386), "strategic" or "json" (RFC 6902 list).

        A 409 is retried unless the patch names ``metadata.resourceVersion`` or ``metadata.uid`` (then
        it is the caller's precondition and raises Conflict) or is a JSON patch (its ``test`` ops are).
        Raises NotFound, InvalidRequest, ApiError.
        """
        return self._send(
            self._patch_req(resource, name, patch, namespace, patch_type, subresource, retry_conflict)
        )

    async def apatch(
        self,
        resource: str,
        name: str,
        patch: Any,
        *,
        namespace: str | None = None,
        patch_type: str = "merge",
        subresource: str | None = None,
        retry_conflict: bool | None = None,
    ) -> dict[str, Any]:
        """`patch` as a coroutine on the running loop."""
        return await self._asend(
            self._patch_req(resource, name, patch, namespace, patch_type, subresource, retry_conflict)
        )

    def _patch_req(
        self, resource: str, name: str, patch: Any, namespace: str | None, patch_type: str,
        subresource: str | None, retry_conflict: bool | None,
    ) -> ApiRequest:  # fmt: skip
        res = resource_of(resource)
        try:
            content_type = _PATCH_TYPES[patch_type]
        except KeyError:
            raise InvalidRequest(f"patch_type {patch_type!r}: want one of {sorted(_PATCH_TYPES)}") from None
        if retry_conflict is None:
            meta = (patch.get("metadata") or {}) if isinstance(patch, dict) else {}
            has_rv = bool(meta.get("resourceVersion") or meta.get("uid"))
            retry_conflict = patch_type != "json" and not has_rv
        what = f"patch {resource}{'/' + subresource if subresource else ''} {ref(namespace, name, res)}"
        return ApiRequest(
            what, "PATCH", self._path(res, name, namespace, subresource or ""), patch, content_type, retry_conflict
        )

    def replace(
        self, resource: str, obj: Mapping[str, Any], *, subresource: str | None = None
    ) -> dict[str, Any]:
        """PUT an object (its ``metadata.resourceVersion`` is the precondition); Conflict on a stale one."""
        res = resource_of(resource)
        meta = meta_of(obj)
        name, ns = meta.get("name", ""), meta.get("namespace") or "default"
        body = {"apiVersion": res.api_version, "kind": res.kind, **obj}
        args = (name, ns, body) if res.namespaced else (name, body)
        fn = self._method(res, "replace", sub=subresource or "")
        return self._call(f"update {resource} {ref(ns, name, res)}", fn, *args)

    def delete(
        self,
        resource: str,
        name: str,
        *,
        namespace: str | None = None,
        grace_period_s: int | None = None,
        uid: str | None = None,
    ) -> bool:
        """DELETE an object; False when it was already gone. `uid`: only delete this incarnation."""
        res = resource_of(resource)
        body: dict[str, Any] = {"apiVersion": "v1", "kind": "DeleteOptions"}
        if grace_period_s is not None:
            body["gracePeriodSeconds"] = grace_period_s
        if uid:
            body["preconditions"] = {"uid": uid}
        args = (name, namespace or "default") if res.namespaced else (name,)
        try:
            self._call(
                f"delete {resource} {ref(namespace, name, res)}",
                self._method(res, "delete"),
                *args,
                body=body,
            )
        except NotFound:
            return False
        return True

    def watch(
        self,
        resource: str,
        *,
        resource_version: str,
        namespace: str | None = None,
        field_selector: str | None = None,
        label_selector: str | None = None,
        timeout_s: float = 300.0,
        bookmarks: bool = True,
    ) -> WatchStream:
        """Open a watch from `resource_version` (server-side timeout `timeout_s`). One attempt, no retry.

        Raises ResourceExpired (410), ApiError or the mapped error of the opening request.
        """
        res = resource_of(resource)
        kwargs: dict[str, Any] = {
            "watch": True,
            "resource_version": resource_version,
            "timeout_seconds": max(1, int(timeout_s)),
            "allow_watch_bookmarks": bookmarks,
            "_preload_content": False,
            # The read timeout must outlast the server's own timeout plus a bookmark's delay.
            "_request_timeout": (self.timeout_s, timeout_s + 30.0),
        }
        fn, args, selectors = self._list_method(res, namespace, field_selector, label_selector)
        kwargs.update(selectors)
        what = f"watch {resource}"
        if self._limiter is not None:
            self._limiter.acquire()
        try:
            resp = fn(*args, **kwargs)
        except ApiException as e:
            raise map_api_exception(e, what) from None
        except TRANSPORT_ERRORS as e:
            raise ApiError(f"{what}: cannot reach the API server: {e}", reason="Transport") from None
        return WatchStream(resp, what)

    # -- nodes -------------------------------------------------------------------------------------

    def get_node(self, name: str) -> dict[str, Any] | None:
        """The Node, or None when it does not exist (HTTP 404)."""
        return self.get("nodes", name)

    def list_nodes(
        self, *, label_selector: str | None = None, field_selector: str | None = None
    ) -> list[dict[str, Any]]:
        """All Nodes matching the selectors."""
        return self.list("nodes", label_selector=label_selector, field_selector=field_selector)

    def patch_node_annotations(
        self, name: str, annotations: Mapping[str, str | None], *, resource_version: str | None = None
    ) -> dict[str, Any]:
        """Merge-patch node annotations (None removes a key); returns the patched Node.

        With `resource_version` the patch applies only to that version of the node: a newer one raises
        Conflict (no retry; the caller re-reads). Raises NotFound when the node is gone.
        """
        return self.patch("nodes", name, _node_annotations_patch(annotations, resource_version))

    async def apatch_node_annotations(
        self, name: str, annotations: Mapping[str, str | None], *, resource_version: str | None = None
    ) -> dict[str, Any]:
        """`patch_node_annotations` as a coroutine on the running loop."""
        return await self.apatch("nodes", name, _node_annotations_patch(annotations, resource_version))

    def patch_node_labels(self, name: str, labels: Mapping[str, str | None]) -> dict[str, Any]:
        """Merge-patch node labels (None removes a key); returns the patched Node."""
        return self.patch("nodes", name, {"metadata": {"labels": dict(labels)}})

    # -- pods --------------------------------------------------------------------------------------

    def get_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The Pod, or None when it does not exist (HTTP 404)."""
        return self.get("pods", name, namespace=namespace)

    def list_pods(
        self,
        *,
        namespace: str | None = None,
        field_selector: str | None = None,
        label_selector: str | None = None,
    ) -> list[dict[str, Any]]:
        """Pods of one namespace or all; e.g. ``field_selector="spec.nodeName=node1"``."""
        return self.list(
            "pods", namespace=namespace, field_selector=field_selector, label_selector=label_selector
        )

    def patch_pod_metadata(
        self,
        namespace: str,
        name: str,
        *,
        annotations: Mapping[str, str | None] | None = None,
        labels: Mapping[str, str | None] | None = None,
        resource_version: str | None = None,
        uid: str | None = None,
    ) -> dict[str, Any]:
        """Merge-patch pod annotations and labels (None removes a key); returns the patched Pod.

        `resource_version` makes it conditional (Conflict when stale); `uid` makes it apply only to
        that incarnation of the pod (Conflict when the pod was re-created). Raises NotFound.
        """
        patch = _pod_metadata_patch(annotations, labels, resource_version, uid)
        return self.patch("pods", name, patch, namespace=namespace, retry_conflict=not (resource_version or uid))

    async def apatch_pod_metadata(
        self,
        namespace: str,
        name: str,
        *,
        annotations: Mapping[str, str | None] | None = None,
        labels: Mapping[str, str | None] | None = None,
        resource_version: str | None = None,
        uid: str | None = None,
    ) -> dict[str, Any]:
        """`patch_pod_metadata` as a coroutine on the running loop."""
        patch = _pod_metadata_patch(annotations, labels, resource_version, uid)
        return await self.apatch(
            "pods", name, patch, namespace=namespace, retry_conflict=not (resource_version or uid)
        )

    def patch_pod_status(self, namespace: str, name: str, status: Mapping[str, Any]) -> dict[str, Any]:
        """Merge-patch ``status`` through the status subresource (the only way to change it)."""
        return self.patch("pods", name, {"status": dict(status)}, namespace=namespace, subresource="status")

    def create_pod(self, pod: Mapping[str, Any], *, namespace: str | None = None) -> dict[str, Any]:
        """Create a Pod; returns it as stored (Conflict when the name is taken)."""
        return self.create("pods", pod, namespace=namespace)

    def delete_pod(
        self, namespace: str, name: str, *, grace_period_s: int | None = None, uid: str | None = None
    ) -> bool:
        """Delete a Pod; False when it was already gone."""
        return self.delete("pods", name, namespace=namespace, grace_period_s=grace_period_s, uid=uid)

    def bind_pod(
        self,
        namespace: str,
        name: str,
        *,
        uid: str | None,
        node: str,
        annotations: Mapping[str, str] | None = None,
    ) -> None:
        """Create the pod's Binding to `node` (what kube-scheduler's default binder does).

        `annotations` ride in the Binding's ``metadata.annotations``: the API server copies them onto
        the pod in the same write that sets ``spec.nodeName`` (k8s pkg/registry/core/pod/storage
        ``setPodHostAndAnnotations``), so the pod is never seen bound without them, nor with them
        but unbound, and one API call is saved.

        Idempotent: if the pod is already bound to `node` (e.g. our earlier try timed out after the
        server applied it) this succeeds, and any of `annotations` the pod lacks are then patched on.
        Raises NotFound (pod gone), Conflict (bound elsewhere, being deleted, or a different pod
        `uid`), ApiError.
        """
        try:
            # A raw request: the server answers a Status that the generated client cannot deserialise
            # as V1Binding (kubernetes-client/python#547).
            self._send(self._binding_req(namespace, name, uid, node, annotations))
        except Conflict:
            missing = _bound_already(self.get_pod(namespace, name), node, uid, annotations)
            if missing is None:
                raise
            if missing:
                self.patch_pod_metadata(namespace, name, annotations=missing, uid=uid)

    async def abind_pod(
        self,
        namespace: str,
        name: str,
        *,
        uid: str | None,
        node: str,
        annotations: Mapping[str, str] | None = None,
    ) -> None:
        """`bind_pod` as a coroutine on the running loop (same idempotence and errors)."""
        try:
            await self._asend(self._binding_req(namespace, name, uid, node, annotations))
        except Conflict:
            pod = await self.aget("pods", name, namespace=namespace)
            missing = _bound_already(pod, node, uid, annotations)
            if missing is None:
                raise
            if missing:
                await self.apatch_pod_metadata(namespace, name, annotations=missing, uid=uid)

    def _binding_req(
        self, namespace: str, name: str, uid: str | None, node: str, annotations: Mapping[str, str] | None
    ) -> ApiRequest:
        meta: dict[str, Any] = {"name": name, "namespace": namespace}
        if uid:
            meta["uid"] = uid
        if annotations:
            meta["annotations"] = dict(annotations)
        body = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": meta,
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        path = self._path(RESOURCES["pods"], name, namespace, "binding")
        return ApiRequest(f"bind pod {namespace}/{name} to node {node}", "POST", path, body)

    # -- events ------------------------------------------------------------------------------------

    def create_event(
        self,
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
        """Record a core/v1 Event about `involved` (a Pod or Node dict, as read from the API).

        `reason` is a CamelCase word (``BindingFailed``); `message` says what happened and what to do,
        cut to 1024 characters. `type` is "Normal" or "Warning". `kind` defaults to the object's kind,
        else Pod for namespaced and Node for cluster-scoped objects. The same (object, reason, message)
        within `event_dedup_s` bumps ``count`` on the existing Event, as client-go's correlator does.
        Events are best effort: returns None instead of raising when the API refuses them.
        """
        return record_event(
            self, self._event_log, involved, reason=reason, message=message, type=type, kind=kind,
            component=component, host=host, action=action, namespace=namespace,
        )  # fmt: skip

    async def acreate_event(
        self,
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
        """`create_event` as a coroutine on the running loop (same repeat counting, same log)."""
        return await arecord_event(
            self, self._event_log, involved, reason=reason, message=message, type=type, kind=kind,
            component=component, host=host, action=action, namespace=namespace,
        )  # fmt: skip

    # -- quotas, namespaces ------------------------------------------------------------------------

    def list_resource_quotas(self, *, namespace: str | None = None) -> list[dict[str, Any]]:
        """ResourceQuotas of one namespace or all."""
        return self.list("resourcequotas", namespace=namespace)

    # -- leases ------------------------------------------------------------------------------------

    def get_lease(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The Lease, or None when it does not exist (HTTP 404)."""
        return self.get("leases", name, namespace=namespace)

    def create_lease(self, namespace: str, name: str, spec: Mapping[str, Any]) -> dict[str, Any]:
        """Create a Lease; raises Conflict when another replica created it first."""
        return self.create("leases", {"metadata": {"name": name, "namespace": namespace}, "spec": dict(spec)})

    def update_lease(self, lease: Mapping[str, Any]) -> dict[str, Any]:
        """PUT a Lease read earlier (its resourceVersion is the precondition); Conflict when stale."""
        return self.replace("leases", lease)


def _node_annotations_patch(annotations: Mapping[str, str | None], resource_version: str | None) -> dict[str, Any]:
    meta: dict[str, Any] = {"annotations": dict(annotations)}
    if resource_version:
        meta["resourceVersion"] = resource_version
    return {"metadata": meta}


def _pod_metadata_patch(
    annotations: Mapping[str, str | None] | None,
    labels: Mapping[str, str | None] | None,
    resource_version: str | None,
    uid: str | None,
) -> dict[str, Any]:
    meta: dict[str, Any] = {}
    if annotations:
        meta["annotations"] = dict(annotations)
    if labels:
        meta["labels"] = dict(labels)
    if resource_version:
        meta["resourceVersion"] = resource_version
    if uid:
        meta["uid"] = uid
    return {"metadata": meta}


def _bound_already(
    pod: Mapping[str, Any] | None, node: str, uid: str | None, annotations: Mapping[str, str] | None
) -> dict[str, str] | None:
    """After a Binding's 409: None when `pod` is not bound to `node` (the conflict stands), else the
    `annotations` it still lacks (our earlier try was applied; {} when nothing is missing)."""
    if pod is None or (pod.get("spec") or {}).get("nodeName") != node or (uid and meta_of(pod).get("uid") != uid):
        return None
    have = meta_of(pod).get("annotations") or {}
    return {k: v for k, v in (annotations or {}).items() if k not in have}
