"""Pod UID -> namespace and name, for the pods bound to this node, kept by one watch.

Why a watch: the monitor must name every cache directory ``<podUID>_<container>`` with its pod on every
scrape; a list per scrape would load the API server with one request per node per scrape interval.
One list+watch of ``spec.nodeName=<node>`` pods (`hami.kube.Reflector`) keeps the index current.

The index also answers the question that guards directory removal: "may the pod of this UID still
exist?" - only a synced index that does not know the UID says no.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class PodRef:
    """The identity of a pod as the metrics label it."""

    namespace: str
    name: str
    uid: str


def pod_ref(pod: Mapping[str, Any]) -> PodRef | None:
    """`PodRef` of an API pod object, or None when it has no UID (never the case for stored pods)."""
    meta = pod.get("metadata") or {}
    uid = meta.get("uid")
    if not uid:
        return None
    return PodRef(namespace=meta.get("namespace") or "", name=meta.get("name") or "", uid=uid)


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
