"""Random interleavings of what happens concurrently around ClusterState, as a hypothesis state machine.

The extender's filter decides and reserves under the state's lock, but its pod patch lands later (or
fails), kube-scheduler binds, pods start, end and are deleted, device plugins rewrite registrations, and
a relist rebuilds the state in the middle of all that. Each rule below is one of those events; the
machine keeps the API server's view (Nodes, Pods) and the patches still in flight, and after every
step checks:

- no card is over-committed (slots, MiB and cores within the card's registration);
- the incremental state equals a rebuild from the API server's objects plus the decisions whose patch
  is still in flight (what `rebuild(..., keep_reservations=True)` keeps).

Bound: 200 examples x 50 steps = 10,000 steps, which takes ~10-20 s on the 2-core dev machine; a
failure shrinks to the shortest interleaving. The examples are derandomized (a fixed seed per code
version) so CI runs are repeatable; run with ``--hypothesis-seed=random`` to explore further.
"""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from hami import annotations as A
from hami.cluster import ClusterState
from hami.model import Device
from hami.registration import encode_node_devices_json
from tests.builders import V100

NODES = ("n0", "n1", "n2")
CARD_MIB = 16000
VENDORS = ClusterState().vendors  # built once: the rebuilt state of every step shares them

shapes = st.tuples(
    st.integers(1, 3),  # cards per container
    st.sampled_from([1000, 4000, 8000, 16000]),  # MiB per card
    st.sampled_from([0, 10, 30, 60, 100]),  # cores percent per card
    st.integers(1, 2),  # containers
    st.booleans(),  # an init container asking the same
)


def registration(name: str, cards: dict[int, tuple[bool, int]]) -> dict[str, Any]:
    """A Node with cards index -> (healthy, MiB); slots 4 per card (few, so slots run out too)."""
    devs = [
        Device(f"GPU-{name}-{i}", i, 4, mem, 100, V100, i % 2, health=ok)
        for i, (ok, mem) in sorted(cards.items())
    ]
    return {"metadata": {"name": name, "annotations": {A.NVIDIA_REGISTER: encode_node_devices_json(devs)}}}


def new_pod(uid: str, shape: tuple[int, int, int, int, bool]) -> dict[str, Any]:
    gpus, mem, cores, n, init = shape
    limits = {"nvidia.com/gpu": str(gpus), "nvidia.com/gpumem": str(mem), "nvidia.com/gpucores": str(cores)}
    spec: dict[str, Any] = {
        "schedulerName": "hami-scheduler",
        "containers": [{"name": f"c{i}", "resources": {"limits": dict(limits)}} for i in range(n)],
    }
    if init:
        spec["initContainers"] = [{"name": "init", "resources": {"limits": dict(limits)}}]
    return {
        "metadata": {"uid": uid, "name": f"pod-{uid}", "namespace": "default", "annotations": {}},
        "spec": spec,
        "status": {"phase": "Pending"},
    }


class Interleavings(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.state = ClusterState(vendors=VENDORS)
        self.cards = {name: {i: (True, CARD_MIB) for i in range(3)} for name in NODES}
        self.nodes = {name: registration(name, c) for name, c in self.cards.items()}
        for n in self.nodes.values():
            self.state.upsert_node(n)
        self.pods: dict[str, dict[str, Any]] = {}  # the API server's pods
        self.inflight: dict[str, dict[str, str]] = {}  # uid -> the filter's annotations, not yet patched
        self.next_uid = 0

    # -- what happens

    @rule(shape=shapes, names=st.lists(st.sampled_from(NODES), min_size=1, max_size=3, unique=True))
    def filter_new_pod(self, shape, names) -> None:
        uid = f"u{self.next_uid}"
        self.next_uid += 1
        self.pods[uid] = new_pod(uid, shape)
        self._filter(uid, names)

    @precondition(lambda self: any(not p["spec"].get("nodeName") for p in self.pods.values()))
    @rule(data=st.data(), names=st.lists(st.sampled_from(NODES), min_size=1, max_size=3, unique=True))
    def retry_filter(self, data, names) -> None:
        """kube-scheduler retries an unbound pod (after a failed bind or a lost reply)."""
        uid = data.draw(
            st.sampled_from(sorted(u for u, p in self.pods.items() if not p["spec"].get("nodeName")))
        )
        self._filter(uid, names)

    def _filter(self, uid: str, names: list[str]) -> None:
        pod = self.pods[uid]
        self.inflight.pop(uid, None)  # a retried filter replaces the earlier decision
        if pod["metadata"]["annotations"].get(A.ASSIGNED_NODE):
            # The retried filter's new decision will overwrite the recorded one; until its patch lands
            # the pod counts as the new reservation, as in the extender.
            pod["metadata"]["annotations"] = {}
        out = self.state.filter(copy.deepcopy(pod), names)
        assert out.error is None
        if out.node is not None:
            assert out.node in names
            self.inflight[uid] = dict(out.annotations)

    @precondition(lambda self: self.inflight)
    @rule(data=st.data())
    def patch_lands(self, data) -> None:
        uid = data.draw(st.sampled_from(sorted(self.inflight)))
        self.pods[uid]["metadata"]["annotations"].update(self.inflight.pop(uid))
        self.state.upsert_pod(copy.deepcopy(self.pods[uid]))

    @precondition(lambda self: self.inflight)
    @rule(data=st.data())
    def patch_fails(self, data) -> None:
        uid = data.draw(st.sampled_from(sorted(self.inflight)))
        del self.inflight[uid]
        self.state.release_reservation(uid)

    @precondition(
        lambda self: any(self._placed(p) and not p["spec"].get("nodeName") for p in self.pods.values())
    )
    @rule(data=st.data())
    def bind(self, data) -> None:
        uid = data.draw(
            st.sampled_from(
                sorted(u for u, p in self.pods.items() if self._placed(p) and not p["spec"].get("nodeName"))
            )
        )
        pod = self.pods[uid]
        pod["spec"]["nodeName"] = pod["metadata"]["annotations"][A.ASSIGNED_NODE]
        pod["metadata"]["annotations"][A.BIND_PHASE] = "allocating"
        self.state.upsert_pod(copy.deepcopy(pod))

    @precondition(lambda self: any(p["spec"].get("nodeName") for p in self.pods.values()))
    @rule(data=st.data(), phase=st.sampled_from(["Running", "Succeeded", "Failed"]), init_done=st.booleans())
    def pod_status(self, data, phase, init_done) -> None:
        uid = data.draw(st.sampled_from(sorted(u for u, p in self.pods.items() if p["spec"].get("nodeName"))))
        pod = self.pods[uid]
        if pod["status"]["phase"] in ("Succeeded", "Failed"):
            return  # a terminal pod stays terminal
        pod["status"] = {"phase": phase}
        if init_done and pod["spec"].get("initContainers"):
            pod["status"]["initContainerStatuses"] = [
                {"name": "init", "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}}
            ]
        self.state.upsert_pod(copy.deepcopy(pod))

    @precondition(lambda self: self.pods)
    @rule(data=st.data())
    def delete(self, data) -> None:
        uid = data.draw(st.sampled_from(sorted(self.pods)))
        del self.pods[uid]
        self.inflight.pop(uid, None)  # its patch would find no pod
        self.state.remove_pod(uid)

    @rule(
        name=st.sampled_from(NODES),
        index=st.integers(0, 3),
        change=st.sampled_from(["health", "grow", "remove", "add"]),
    )
    def node_update(self, name, index, change) -> None:
        """The device plugin rewrites the registration: a card turns (un)healthy, grows, goes, comes."""
        cards = self.cards[name]
        if change == "health" and index in cards:
            ok, mem = cards[index]
            cards[index] = (not ok, mem)
        elif change == "grow" and index in cards:
            cards[index] = (cards[index][0], cards[index][1] + 4000)
        elif change == "remove" and index in cards and len(cards) > 1:
            del cards[index]
        elif change == "add" and index not in cards:
            cards[index] = (True, CARD_MIB)
        self.nodes[name] = registration(name, cards)
        assert self.state.upsert_node(copy.deepcopy(self.nodes[name])) is None

    @rule()
    def relist(self) -> None:
        """A relist in the middle of a term: the listed objects, plus reservations still in flight."""
        self.state.rebuild(
            [copy.deepcopy(n) for n in self.nodes.values()],
            [copy.deepcopy(p) for p in self.pods.values()],
            keep_reservations=True,
        )

    # -- what must always hold

    @staticmethod
    def _placed(pod: dict[str, Any]) -> bool:
        return bool(pod["metadata"]["annotations"].get(A.ASSIGNED_NODE))

    @invariant()
    def no_card_is_over_committed(self) -> None:
        for s in self.state.card_stats():
            assert s.used <= s.count, s
            assert s.usedmem <= s.devmem, s
            assert s.usedcores <= s.devcore, s

    @invariant()
    def incremental_equals_a_rebuild(self) -> None:
        pods = []
        for uid, pod in self.pods.items():
            if uid in self.inflight:
                meta = {
                    **pod["metadata"],
                    "annotations": {**pod["metadata"]["annotations"], **self.inflight[uid]},
                }
                pod = {**pod, "metadata": meta}
            pods.append(pod)
        rebuilt = ClusterState(vendors=VENDORS)
        rebuilt.rebuild(self.nodes.values(), pods)  # reads the objects, never changes them
        assert self.state.usage_snapshot() == rebuilt.usage_snapshot()


Interleavings.TestCase.settings = settings(
    max_examples=200,
    stateful_step_count=50,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
test_interleavings = Interleavings.TestCase
