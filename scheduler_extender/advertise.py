"""`--advertise-node-resources`: keep each GPU node's `status.capacity` and `status.allocatable` of the
device memory and cores resources (`nvidia.com/gpumem`, `nvidia.com/gpucores`) equal to its cards'
totals (`hami.preemption.advertised_totals`), so that kube-scheduler counts them (with
`ignoredByScheduler: false` for those two resources) and its preemption dry run can find victims.

Why the extender: it reads every node's registration already, and only the active replica writes (this
runs inside one leadership term's `ClusterSync`). Writes happen off the watch callbacks, on one worker
thread, and only when a node's advertised values differ from its cards' totals: at the first list, when
a registration changes, and when the kubelet zeroed the node's extended resources (it does after a
node is re-created, until someone advertises them again; Kubernetes' documented way to advertise
extended resources is this very status patch, which the kubelet keeps).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any

from hami.cluster import ClusterState
from hami.errors import HamiError
from hami.preemption import advertised_totals

log = logging.getLogger(__name__)


def wanted(state: ClusterState, name: str) -> dict[str, str]:
    """The capacity entries node `name` should advertise: NVIDIA's memory and cores totals ({} for a node
    without NVIDIA cards). Other vendors' memory units vary (256 MiB, GiB, ...): not advertised."""
    vendor = state.vendors.get("NVIDIA")
    if vendor is None:
        return {}
    cards = [c for c in state.node_cards(name) if c.vendor == "NVIDIA"]
    return {k: str(v) for k, v in advertised_totals(cards, vendor.resource_names()).items()}


def differs(node: Mapping[str, Any], want: Mapping[str, str]) -> bool:
    status = node.get("status") or {}
    cap, alloc = status.get("capacity") or {}, status.get("allocatable") or {}
    return any(str(cap.get(k)) != v or str(alloc.get(k)) != v for k, v in want.items())


class NodeAdvertiser:
    """One worker thread that patches the nodes `notify` names when their advertised totals are off.

    `lookup(name)` returns the watched Node (or None). API errors are logged and retried at the next
    notification of that node.
    """

    def __init__(
        self, client: Any, state: ClusterState, lookup: Callable[[str], dict[str, Any] | None]
    ) -> None:
        self.client = client
        self.state = state
        self.lookup = lookup
        self._pending: dict[str, None] = {}
        self._cond = threading.Condition()
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name="extender-advertise", daemon=True)
        self.patched = 0

    def start(self) -> NodeAdvertiser:
        self._thread.start()
        return self

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
        self._thread.join(5.0)

    def notify(self, name: str) -> None:
        with self._cond:
            self._pending[name] = None
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._pending and not self._stopped:
                    self._cond.wait()
                if self._stopped:
                    return
                name = next(iter(self._pending))
                del self._pending[name]
            try:
                self.advertise(name)
            except Exception:  # noqa: BLE001 - the worker must survive anything
                log.exception("node %s: advertising device totals failed", name)

    def advertise(self, name: str) -> bool:
        """Patch node `name` when its advertised totals differ from its cards'; True when patched."""
        node = self.lookup(name)
        want = wanted(self.state, name)
        if node is None or not want or not differs(node, want):
            return False
        try:
            self.client.patch(
                "nodes", name, {"status": {"capacity": want, "allocatable": want}}, subresource="status"
            )
        except HamiError as e:
            log.warning("node %s: device totals not advertised: %s", name, e)
            return False
        self.patched += 1
        log.info("node %s: advertised %s", name, ", ".join(f"{k}={v}" for k, v in sorted(want.items())))
        return True
