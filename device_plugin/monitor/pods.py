"""Pod UID -> namespace and name, for the pods bound to this node, kept by one watch.

Why a watch: the monitor must name every cache directory ``<podUID>_<container>`` with its pod on every
scrape; a list per scrape would load the API server with one request per node per scrape interval.
One list+watch of ``spec.nodeName=<node>`` pods (`hami.kube.Reflector`) keeps the index current.

The index also answers the question that guards directory removal: "may the pod of this UID still
exist?" - only a synced index that does not know the UID says no.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hami import annotations as A
from hami import pods as P
from hami.errors import AnnotationError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class MigDevice:
    """One MIG instance a container of the pod holds, as the device plugin recorded it."""

    container: str
    vdevice_index: int
    device_uuid: str
    mig_uuid: str
    profile: str
    gpu_instance_id: int
    compute_instance_id: int


@dataclass(frozen=True)
class PodRef:
    """The identity of a pod as the metrics label it, and its MIG instances (``hami_mig_device_info``)."""

    namespace: str
    name: str
    uid: str
    mig: tuple[MigDevice, ...] = ()


def mig_devices(pod: Mapping[str, Any]) -> tuple[MigDevice, ...]:
    """The realised entries of the pod's ``hami.io/vgpu-mig-allocations`` (runtime identity recorded),
    each with its container's name (index = position in init containers, then containers, as HAMi).
    An unreadable annotation or an index without a container is logged and left out (HAMi too)."""
    meta = pod.get("metadata") or {}
    raw = (meta.get("annotations") or {}).get(A.MIG_ALLOCATIONS)
    if not raw:
        return ()
    try:
        allocations = A.decode_mig_allocations(raw)
    except AnnotationError as e:
        log.warning("pod %s/%s: %s: %s", meta.get("namespace"), meta.get("name"), A.MIG_ALLOCATIONS, e)
        return ()
    names = [c.get("name", "") for _, c in P.entries(pod)]
    out = []
    for a in allocations:
        if not a.realized:
            continue
        if a.container_index >= len(names):
            log.warning("pod %s/%s: MIG allocation of container index %d, which the pod does not have",
                        meta.get("namespace"), meta.get("name"), a.container_index)  # fmt: skip
            continue
        out.append(MigDevice(names[a.container_index], a.device_index, a.gpu_uuid, a.mig_uuid, a.profile,
                             a.gpu_instance_id or 0, a.compute_instance_id or 0))  # fmt: skip
    return tuple(out)


def pod_ref(pod: Mapping[str, Any]) -> PodRef | None:
    """`PodRef` of an API pod object, or None when it has no UID (never the case for stored pods)."""
    meta = pod.get("metadata") or {}
    uid = meta.get("uid")
    if not uid:
        return None
    return PodRef(
        namespace=meta.get("namespace") or "", name=meta.get("name") or "", uid=uid, mig=mig_devices(pod)
    )


class PodIndex:
    """Thread-safe UID -> `PodRef` map fed by reflector callbacks (`on_sync`, `on_add`, ...).

    `synced` is False until the first complete list arrived: before that no UID is known to be gone.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_uid: dict[str, PodRef] = {}
        self._synced = threading.Event()

    # -- reflector callbacks ------------------------------------------------------------------------

    def on_sync(self, items: list[dict[str, Any]]) -> None:
        fresh = {}
        for pod in items:
            ref = pod_ref(pod)
            if ref is not None:
                fresh[ref.uid] = ref
        with self._lock:
            self._by_uid = fresh
        self._synced.set()

    def on_add(self, pod: dict[str, Any]) -> None:
        ref = pod_ref(pod)
        if ref is not None:
            with self._lock:
                self._by_uid[ref.uid] = ref

    def on_update(self, _old: dict[str, Any], new: dict[str, Any]) -> None:
        self.on_add(new)

    def on_delete(self, pod: dict[str, Any]) -> None:
        ref = pod_ref(pod)
        if ref is not None:
            with self._lock:
                self._by_uid.pop(ref.uid, None)

    # -- queries ------------------------------------------------------------------------------------

    @property
    def synced(self) -> bool:
        return self._synced.is_set()

    def wait_synced(self, timeout_s: float | None = None) -> bool:
        return self._synced.wait(timeout_s)

    def get(self, uid: str) -> PodRef | None:
        with self._lock:
            return self._by_uid.get(uid)

    def snapshot(self) -> dict[str, PodRef]:
        """A copy of the whole map (one lock acquisition per scan instead of one per directory)."""
        with self._lock:
            return dict(self._by_uid)

    def __len__(self) -> int:
        with self._lock:
            return len(self._by_uid)
