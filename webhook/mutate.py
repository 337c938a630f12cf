"""The admission decision for one pod: the orchestration of hami-legacy-spec §2.1 with the issue's rules.

Order of the steps, and why:
1. CREATE of core/v1 pods (no sub-resource) is reviewed as below; an UPDATE only for who changes an
   allocation annotation (`Mutator.review_update`); anything else is allowed unchanged, except
   another kind, which is a configuration mistake and is denied with a message saying so.
2. `hami.io/webhook: ignore` as a label of the pod or of its namespace: allowed unchanged. Only labels
   count, as in HAMi (the MutatingWebhookConfiguration selectors can only see labels): an annotation
   of that name would let any user skip step 3 with forged allocation annotations, so it only earns
   a warning.
3. Allocation annotations a user wrote are removed, whatever the scheduler: the extender counts usage
   from them, so a forged `hami.io/vgpu-devices-allocated` could make free cards look full.
4. Pods that name a scheduler we may not take over are otherwise left alone (HAMi step 2).
5. Every vendor hook sees every container: init containers (native sidecars included), then app
   containers. A vendor error is a denial naming the container and the field.
6. Device pods: privileged containers, a preset `spec.nodeName` and the policy annotations are checked,
   `schedulerName` is set, and the namespace quota is pre-checked against the cached view.
7. Warnings for annotation mistakes; the patch is the diff of the original and the mutated pod.
The whole function is pure over its inputs (pod, settings, cached views), so dry-run and real
requests get the same answer and a reinvocation produces no second change.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hami import annotations as keys
from hami import pods, scoring
from hami.errors import InvalidRequest
from hami.quota import containers_demand
from hami.vendors.base import Vendor
from webhook import rules
from webhook.patch import diff, json_copy
from webhook.review import AdmissionRequest, Decision, allow, deny
from webhook.views import NamespaceView, QuotaView

DEFAULT_SCHEDULER = "default-scheduler"


@dataclass(frozen=True)
class WebhookSettings:
    """Webhook flags. `takeover_schedulers`: schedulerName values we replace with `scheduler_name`
    (an absent field arrives as ``default-scheduler`` after defaulting; ``""`` covers old API servers).
    An empty `scheduler_name` disables the takeover (HAMi: `--scheduler-name` unset)."""

    scheduler_name: str = "hami-scheduler"
    takeover_schedulers: frozenset[str] = frozenset({DEFAULT_SCHEDULER, ""})
    allocation_writers: frozenset[str] = frozenset()
    """Usernames (``userInfo.username``, ``system:serviceaccount:<ns>:<name>``) that may change a pod's
    allocation annotations after CREATE: the scheduler's and the device plugin's service accounts."""


@dataclass(frozen=True)
class _Slot:
    """One container of the pod with its JSON path, for messages (`spec.initContainers[0]`)."""

    container: dict[str, Any]
    path: str
    init: bool
    sidecar: bool

    @property
    def label(self) -> str:
        return f"container {self.container.get('name', '?')} ({self.path})"


def _annotations(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = pod.get("metadata")
    ann = meta.get("annotations") if isinstance(meta, Mapping) else None
    return ann if isinstance(ann, Mapping) else {}


def _containers(spec: dict[str, Any]) -> list[_Slot]:
    slots = []
    for field in pods.CONTAINER_FIELDS:  # device-list order: init containers first
        init = field == "initContainers"
        items = spec.get(field) or []
        if not isinstance(items, list):
            raise InvalidRequest(f"spec.{field} must be a list of containers")
        for i, c in enumerate(items):
            if not isinstance(c, dict):
                raise InvalidRequest(f"spec.{field}[{i}] must be an object (a container)")
            _check_container_shape(c, f"spec.{field}[{i}]")
            sidecar = pods.kind_of(c, init=init) is pods.ContainerKind.SIDECAR
            slots.append(_Slot(container=c, path=f"spec.{field}[{i}]", init=init, sidecar=sidecar))
    return slots


#: The container shape rules live with the pod rules, shared with the scheduler's request parsing.
_check_container_shape = pods.check_container_shape


def _locate(message: str, slot: _Slot) -> str:
    """Prefix a vendor's message with the container it is about, unless the vendor already named it."""
    name = slot.container.get("name", "?")
    if message.startswith(f"container {name}"):
        return message
    return f"{slot.label}: {message}"


class Mutator:
    """Reviews pods. Stateless between calls; safe to share across concurrent requests.

    `vendors`: the vendor hooks, in registry order; `quota`/`namespaces`: optional cached views (None =
    no quota pre-check / namespace labels only enforced by the webhook configuration's selector).
    """

    def __init__(
        self,
        vendors: Sequence[Vendor],
        settings: WebhookSettings | None = None,
        *,
        quota: QuotaView | None = None,
        namespaces: NamespaceView | None = None,
    ) -> None:
        self.vendors = list(vendors)
        self.settings = settings or WebhookSettings()
        self.quota = quota
        self.namespaces = namespaces
        allocation = [
            k for v in self.vendors for k in (*v.allocation_keys(), v.to_allocate_key, v.allocated_key)
        ]
        self._protected = tuple(dict.fromkeys(k for k in [*rules.HAMI_WRITTEN_KEYS, *allocation] if k))
        self._resource_names = frozenset(r for v in self.vendors for r in v.resource_names().all())
        self._selection_keys = frozenset(
            [*rules.POLICY_KEYS, *(k for v in self.vendors for k in v.user_annotation_keys())]
        )
        self._known = frozenset(
            [*self._protected, *self._selection_keys, keys.WEBHOOK_IGNORE, keys.SCHEDULER_ROLE]
        )
        # A vendor owns the domains of its resource names and selection keys (nvidia.com/): unknown keys
        # there are likely typos of ours, unlike keys of unrelated tools.
        owned = [k.split("/", 1)[0] + "/" for k in (*self._resource_names, *self._selection_keys) if "/" in k]
        self._prefixes = tuple(dict.fromkeys([rules.HAMI_PREFIX, *sorted(owned)]))

    @property
    def protected_annotation_keys(self) -> tuple[str, ...]:
        """Allocation annotation keys removed on CREATE (HAMi's own keys, then each vendor's)."""
        return self._protected

    def review(self, request: AdmissionRequest) -> Decision:
        """The decision for one AdmissionRequest (see the module docstring for the steps).

        Never raises for bad input: malformed pods are denials with code 400 naming the field.
        """
        kind = request.kind
        if kind and (kind.get("group", "") != "" or kind.get("kind") != "Pod"):
            gvk = "/".join(p for p in (kind.get("group"), kind.get("version"), kind.get("kind")) if p)
            return deny(
                f"this webhook reviews core/v1 Pods only, got {gvk}; restrict the rules of the "
                "MutatingWebhookConfiguration to resources: [pods]",
                code=400,
                reason="BadRequest",
            )
        if request.operation == "UPDATE" and not request.sub_resource:
            return self.review_update(request)
        if request.operation != "CREATE" or request.sub_resource:
            return allow()
        if request.object is None:
            return deny(
                "request.object is missing: a CREATE review must carry the pod", code=400, reason="BadRequest"
            )
        try:
            return self.mutate_pod(request.object, namespace=request.namespace)
        except InvalidRequest as exc:
            return deny(str(exc), code=400, reason="BadRequest")

    def review_update(self, request: AdmissionRequest) -> Decision:
        """An UPDATE (PUT or PATCH) of a pod: refused when it adds, changes or removes an allocation
        annotation and the requester is not one of `WebhookSettings.allocation_writers`.

        Why: the scheduler counts a card's usage from these annotations and the device plugin serves
        the limits they name, so a pod owner who rewrote its running pod's
        ``hami.io/vgpu-devices-allocated`` down to 1 MiB would free the card for others, and one who
        rewrote ``hami.io/vgpu-devices-to-allocate`` between Bind and Allocate would serve itself a
        whole card. Nothing else of the update is looked at, and nothing is patched (most pod fields are
        immutable on UPDATE; a patch would get the request rejected).
        """
        new, old = request.object, request.old_object
        if new is None or old is None:
            return deny(
                "request.object and request.oldObject are required for an UPDATE review",
                code=400,
                reason="BadRequest",
            )
        before = _annotations(old)
        after = _annotations(new)
        changed = [k for k in self._protected if before.get(k) != after.get(k)]
        if not changed or request.username in self.settings.allocation_writers:
            return allow()
        who = request.username or "an unauthenticated user"
        return deny(
            f"{who} may not change {', '.join(changed)} on pod {request.namespace}/{request.name}: "
            "allocation annotations are written by the HAMi scheduler and device plugin only "
            f"({', '.join(sorted(self.settings.allocation_writers)) or 'no writer configured'})"
        )

    def mutate_pod(self, pod: dict[str, Any], *, namespace: str = "") -> Decision:
        """The decision for a pod being created in `namespace` (the pod's own namespace if empty).

        Raises InvalidRequest only for a structurally malformed pod (e.g. `spec` not an object).
        """
        meta = pod.get("metadata")
        meta = {} if meta is None else meta
        if not isinstance(meta, dict):
            raise InvalidRequest("metadata must be an object")
        namespace = namespace or meta.get("namespace") or "default"
        labels = meta.get("labels") if isinstance(meta.get("labels"), dict) else {}
        annotations_in = meta.get("annotations") if isinstance(meta.get("annotations"), dict) else {}
        if rules.is_ignored(labels):
            return allow()
        if self.namespaces is not None and rules.is_ignored(self.namespaces.labels(namespace)):
            return allow()
        spec = pod.get("spec")
        if not isinstance(spec, dict):
            raise InvalidRequest("spec is missing or not an object")
        if not spec.get("containers"):
            return deny("pod has no containers (spec.containers is empty)", code=400, reason="BadRequest")

        mutated = json_copy(pod)
        warnings: list[str] = []
        if rules.is_ignored(annotations_in):
            warnings.append(
                f"annotation {keys.WEBHOOK_IGNORE}: {rules.IGNORE_VALUE} has no effect; "
                "to opt a pod out, set it as a label"
            )
        # Not setdefault: a pod sent without metadata must not get an empty one added by the patch.
        m_meta = mutated.get("metadata") or {}
        m_ann = m_meta.get("annotations")
        if isinstance(m_ann, dict):
            for key in rules.strip_allocation_annotations(m_ann, self._protected):
                warnings.append(f"removed annotation {key}: allocation annotations are written by HAMi only")

        m_spec = mutated["spec"]
        scheduler = m_spec.get("schedulerName", "")
        ours = self.settings.scheduler_name
        if scheduler != ours and scheduler not in self.settings.takeover_schedulers:
            return self._finish(pod, mutated, warnings, has_devices=False, check_unknown=False)

        slots = _containers(m_spec)
        device_slots: list[_Slot] = []
        errors: list[str] = []
        for slot in slots:
            uses = False
            for vendor in self.vendors:
                try:
                    result = vendor.mutate_container(slot.container, pod=mutated)
                except InvalidRequest as exc:
                    errors.append(_locate(str(exc), slot))
                    continue
                uses = result.uses_device or uses
                warnings.extend(result.warnings)
            if uses:
                device_slots.append(slot)
        if errors:
            return deny("; ".join(errors), warnings=warnings)
        if not device_slots:
            return self._finish(pod, mutated, warnings, has_devices=False)

        asked = self._asked_resources(spec)
        for slot in slots:
            ctx = slot.container.get("securityContext") or {}
            if isinstance(ctx, dict) and ctx.get("privileged") is True:
                return deny(
                    f"{slot.label}: securityContext.privileged is true, but the pod asks for {asked}; "
                    "a privileged container sees every device of the node; valid: false or unset",
                    warnings=warnings,
                )
        node_name = m_spec.get("nodeName")
        if node_name:
            return deny(
                f"spec.nodeName is already set to {node_name!r}, but the pod asks for {asked} and must be "
                f"placed by the scheduler {ours or 'of HAMi'!r}; valid: unset",
                warnings=warnings,
            )
        m_ann = m_meta.get("annotations") or {}
        policy_errors = []
        for key, check in rules.POLICY_CHECKS.items():
            if scoring.is_set(m_ann.get(key)):  # blank = not set, as the scheduler reads it
                try:
                    check(str(m_ann[key]))
                except InvalidRequest as exc:
                    policy_errors.append(str(exc))
        if policy_errors:
            return deny("; ".join(policy_errors), warnings=warnings)
        if ours:
            m_spec["schedulerName"] = ours
        quota_error = self._check_quota(namespace, slots)
        if quota_error:
            return deny(quota_error, warnings=warnings)
        return self._finish(pod, mutated, warnings, has_devices=True)

    def _asked_resources(self, spec: Mapping[str, Any]) -> str:
        """The managed resources the user wrote (before our defaults), for messages: ``nvidia.com/gpu``."""
        names: dict[str, None] = {}
        for field in pods.CONTAINER_FIELDS:
            for c in spec.get(field) or []:
                res = c.get("resources") or {} if isinstance(c, Mapping) else {}
                for part in ("limits", "requests"):
                    for name in res.get(part) or {}:
                        if name in self._resource_names:
                            names[name] = None
        return ", ".join(names) or "devices"

    def _check_quota(self, namespace: str, slots: Sequence[_Slot]) -> str | None:
        """Denial text when the pod alone exceeds a namespace quota (hami-legacy-spec §2.2.4), else None.

        Only "the pod alone" is decided here: usage by other pods changes between admission and
        scheduling and is checked by the scheduler with its live counters. Native sidecars run next to
        the app containers and to the init containers declared after them, plain init containers one at
        a time (`hami.quota.containers_demand`, the pod rule the scheduler charges by).
        """
        if self.quota is None:
            return None
        demand = containers_demand(
            [
                pods.container_spec(s.container, pods.kind_of(s.container, init=s.init), self.vendors)
                for s in slots
            ]
        )
        if not demand:
            return None
        problem = self.quota.exceeds_alone(namespace, demand)
        return f"exceeding resource quota: {problem}" if problem else None

    def _finish(
        self,
        original: dict[str, Any],
        mutated: dict[str, Any],
        warnings: list[str],
        *,
        has_devices: bool,
        check_unknown: bool = True,
    ) -> Decision:
        ann = (mutated.get("metadata") or {}).get("annotations") or {}
        if check_unknown and isinstance(ann, Mapping):
            warnings.extend(
                rules.annotation_warnings(
                    ann,
                    known=self._known,
                    resource_names=self._resource_names,
                    selection_keys=self._selection_keys,
                    prefixes=self._prefixes,
                    has_devices=has_devices,
                )
            )
        return allow(patch=diff(original, mutated), warnings=warnings)
