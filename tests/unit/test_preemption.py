"""Device-aware preemption, hand-worked cases: which pods `ClusterState.plan_preemption` evicts on a node
so that a higher-priority pod fits its cards by the filter's own fit (memory, cores, slots, type and
UUID rules, NUMA, several cards, quotas), and kube-scheduler's rules for the rest (lower priority only,
PodDisruptionBudgets, fewest pods, then least priority, then most recent).

Every case builds the node's pods with explicit card allocations (the annotations the extender writes),
so the expected victims are worked out by hand from the numbers in the case.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import pytest

from hami import annotations as A
from hami.cluster import ClusterState
from hami.model import ContainerDevice, Device
from hami.preemption import (
    DisruptionBudget,
    Resident,
    choose_victims,
    parse_time,
    pdb_violations,
)
from tests.builders import V100, cards, ctr, node, pod

_n = itertools.count()
T4 = "NVIDIA-Tesla T4"
#: name -> the Pod object `running` last built under that name
PODS: dict[str, dict] = {}


def running(
    cs: ClusterState,
    where: str,
    alloc: Sequence[tuple[str, int, int]],
    *,
    prio: int = 0,
    created: str = "2026-01-01T00:00:00Z",
    ns: str = "default",
    labels: dict | None = None,
    name: str | None = None,
    deleting: bool = False,
) -> str:
    """A one-container pod of priority `prio` running on `where` with `alloc` = [(card, MiB, cores)]."""
    k = next(_n)
    uid, name = f"low-{k}", name or f"low-{k}"
    devices = [ContainerDevice(u, "NVIDIA", m, c) for u, m, c in alloc]
    meta = {
        "uid": uid,
        "name": name,
        "namespace": ns,
        "creationTimestamp": created,
        "labels": dict(labels or {}),
        "annotations": {A.ASSIGNED_NODE: where, A.NVIDIA_ALLOCATED: A.encode_pod_devices([devices])},
    }
    if deleting:
        meta["deletionTimestamp"] = "2026-01-02T00:00:00Z"
    p = {
        "metadata": meta,
        "spec": {
            "schedulerName": "hami-scheduler",
            "priority": prio,
            "nodeName": where,
            "containers": [ctr(gpu=len(alloc), mem=alloc[0][1], cores=alloc[0][2])],
        },
        "status": {"phase": "Running"},
    }
    cs.upsert_pod(p)
    PODS[name] = p
    return name


def preemptor(*containers, prio: int = 1000, ns: str = "default", annotations=None) -> dict:
    p = pod(*containers, ns=ns, annotations=annotations)
    p["spec"]["priority"] = prio
    return p


def victims_of(cs: ClusterState, p: dict, where: str = "n", proposed=None, **kw) -> list[str] | None:
    plan = cs.plan_preemption(p, {where: proposed}, **kw).get(where)
    return None if plan is None else [v.name for v in plan.victims]


def one_card(mem: int = 32768, count: int = 10, **kw) -> ClusterState:
    cs = ClusterState()
    cs.upsert_node(node("n", [Device("GPU-0", 0, count, mem, 100, V100, **kw)]))
    return cs


# -- memory, priority, recency -----------------------------------------------------------------------


def test_fewest_pods_win_over_lower_priorities():
    # 32768 MiB card: a (16000), b (8000), c (8000) leave 768 free. 16000 are needed: a alone frees
    # 16768; b and c together only 16768 too, with two pods. a is chosen though it has the higher priority.
    cs = one_card()
    running(cs, "n", [("GPU-0", 16000, 0)], prio=50, name="a")
    running(cs, "n", [("GPU-0", 8000, 0)], prio=0, name="b")
    running(cs, "n", [("GPU-0", 8000, 0)], prio=0, name="c")
    assert victims_of(cs, preemptor(ctr(gpu=1, mem=16000))) == ["a"]


def test_among_equal_counts_the_least_priority_goes():
    # Either a (prio 10) or b (prio 5) frees 16000 alone; b's priority is lower.
    cs = one_card()
    running(cs, "n", [("GPU-0", 16000, 0)], prio=10, name="a")
    running(cs, "n", [("GPU-0", 16000, 0)], prio=5, name="b")
    assert victims_of(cs, preemptor(ctr(gpu=1, mem=16000))) == ["b"]


def test_among_equal_priorities_the_most_recent_goes():
    cs = one_card()
    running(cs, "n", [("GPU-0", 16000, 0)], created="2026-01-01T00:00:00Z", name="old")
    running(cs, "n", [("GPU-0", 16000, 0)], created="2026-03-01T00:00:00Z", name="new")
    assert victims_of(cs, preemptor(ctr(gpu=1, mem=16000))) == ["new"]


def test_two_pods_when_no_single_pod_frees_enough():
    # Free 32768 - 3 x 10000 = 2768; 20000 needed: two 10000 pods free 22768, one only 12768.
    cs = one_card()
    for name, created in (
        ("x", "2026-01-01T00:00:00Z"),
        ("y", "2026-02-01T00:00:00Z"),
        ("z", "2026-03-01T00:00:00Z"),
    ):
        running(cs, "n", [("GPU-0", 10000, 0)], created=created, name=name)
    # The two most recently created go, listed most important (earliest) first.
    assert victims_of(cs, preemptor(ctr(gpu=1, mem=20000))) == ["y", "z"]


def test_higher_and_equal_priority_pods_are_never_victims():
    cs = one_card()
    running(cs, "n", [("GPU-0", 30000, 0)], prio=1000, name="peer")
    running(cs, "n", [("GPU-0", 2000, 0)], prio=0, name="small")
    # Evicting `small` frees 2768 MiB; the 10000 MiB preemptor still does not fit: no plan.
    assert victims_of(cs, preemptor(ctr(gpu=1, mem=10000), prio=1000)) is None


def test_a_pod_that_fits_already_needs_no_preemption():
    cs = one_card()
    running(cs, "n", [("GPU-0", 8000, 0)])
    assert victims_of(cs, preemptor(ctr(gpu=1, mem=8000))) is None


# -- cores, slots, exclusivity --------------------------------------------------------------------------


def test_cores_decide_when_memory_is_free():
    # 60 + 30 cores used; 50 needed: evicting the 30 leaves 60 + 50 > 100, evicting the 60 works.
    cs = one_card()
    running(cs, "n", [("GPU-0", 1000, 60)], name="big")
    running(cs, "n", [("GPU-0", 1000, 30)], name="small")
    assert victims_of(cs, preemptor(ctr(gpu=1, mem=1000, cores=50))) == ["big"]


def test_a_sharer_slot_is_freed_by_one_pod():
    # Split count 2, both slots taken by tiny pods: one eviction gives the slot back.
    cs = one_card(count=2)
    running(cs, "n", [("GPU-0", 100, 1)], created="2026-01-01T00:00:00Z", name="first")
    running(cs, "n", [("GPU-0", 100, 1)], created="2026-02-01T00:00:00Z", name="second")
    assert victims_of(cs, preemptor(ctr(gpu=1, mem=100, cores=1))) == ["second"]


def test_a_whole_card_request_needs_an_idle_card():
    # gpucores 100 takes a card only when no pod is on it (ExclusiveDeviceAllocateConflict).
    cs = one_card()
    for k in range(3):
        running(cs, "n", [("GPU-0", 1000, 5)], name=f"s{k}")
    assert victims_of(cs, preemptor(ctr(gpu=1, mem=1000, cores=100))) == ["s0", "s1", "s2"]


# -- several cards, type and UUID rules, NUMA --------------------------------------------------------


def test_the_card_that_frees_room_with_fewest_evictions():
    # Card 0 holds three small pods, card 1 one big one: a 20000 MiB pod evicts the big one only.
    cs = ClusterState()
    cs.upsert_node(node("n", cards("n", 2)))
    for k in range(3):
        running(cs, "n", [("GPU-n-0", 10000, 0)], name=f"small{k}")
    running(cs, "n", [("GPU-n-1", 30000, 0)], prio=40, name="big")
    assert victims_of(cs, preemptor(ctr(gpu=1, mem=20000))) == ["big"]


def test_a_two_card_pod_frees_two_cards():
    cs = ClusterState()
    cs.upsert_node(node("n", cards("n", 3)))
    running(cs, "n", [("GPU-n-0", 30000, 0)], name="a", created="2026-01-01T00:00:00Z")
    running(cs, "n", [("GPU-n-1", 30000, 0)], name="b", created="2026-02-01T00:00:00Z")
    running(cs, "n", [("GPU-n-2", 30000, 0)], name="c", created="2026-03-01T00:00:00Z")
    # Any two cards will do; the two most recently created pods go.
    assert victims_of(cs, preemptor(ctr(gpu=2, mem=20000))) == ["b", "c"]


def test_a_multi_card_victim_frees_all_its_cards_at_once():
    cs = ClusterState()
    cs.upsert_node(node("n", cards("n", 2)))
    running(cs, "n", [("GPU-n-0", 30000, 0), ("GPU-n-1", 30000, 0)], name="wide")
    running(cs, "n", [("GPU-n-0", 1000, 0)], name="tiny0")
    running(cs, "n", [("GPU-n-1", 1000, 0)], name="tiny1")
    assert victims_of(cs, preemptor(ctr(gpu=2, mem=20000))) == ["wide"]


def test_type_rule_limits_victims_to_the_cards_the_pod_may_use():
    cs = ClusterState()
    cs.upsert_node(
        node("n", [Device("GPU-v", 0, 10, 32768, 100, V100), Device("GPU-t", 1, 10, 16384, 100, T4)])
    )
    running(cs, "n", [("GPU-t", 16000, 0)], prio=0, name="on-t4")
    running(cs, "n", [("GPU-v", 30000, 0)], prio=500, name="on-v100")
    # The T4's pod is cheaper to evict, but the pod may only use V100 cards.
    p = preemptor(ctr(gpu=1, mem=8000), annotations={"nvidia.com/use-gputype": "V100"})
    assert victims_of(cs, p) == ["on-v100"]
    assert victims_of(cs, preemptor(ctr(gpu=1, mem=8000))) == ["on-t4"]


def test_uuid_rule():
    cs = ClusterState()
    cs.upsert_node(node("n", cards("n", 2)))
    running(cs, "n", [("GPU-n-0", 30000, 0)], prio=0, name="zero")
    running(cs, "n", [("GPU-n-1", 30000, 0)], prio=10, name="one")
    p = preemptor(ctr(gpu=1, mem=8000), annotations={"nvidia.com/nouse-gpuuuid": "GPU-n-0"})
    assert victims_of(cs, p) == ["one"]


def test_numa_bind_frees_two_cards_of_one_numa_node():
    # Cards 0,1 on NUMA 0 and 2,3 on NUMA 1. NUMA 0: one pod on card 0; NUMA 1: one pod on each card.
    # Two cards of one NUMA node are needed: evicting the one pod on NUMA 0 is enough.
    cs = ClusterState()
    cs.upsert_node(node("n", cards("n", 4, numa=[0, 0, 1, 1])))
    running(cs, "n", [("GPU-n-0", 30000, 0)], prio=90, name="numa0")
    running(cs, "n", [("GPU-n-1", 0, 0)], prio=90, name="numa0-empty-share")  # a slot, no memory
    running(cs, "n", [("GPU-n-2", 30000, 0)], prio=0, name="numa1-a")
    running(cs, "n", [("GPU-n-3", 30000, 0)], prio=0, name="numa1-b")
    p = preemptor(ctr(gpu=2, mem=20000), annotations={"nvidia.com/numa-bind": "true"})
    assert victims_of(cs, p) == ["numa0"]


# -- quotas ------------------------------------------------------------------------------------------------


def quota(ns: str, mem: int) -> dict:
    return {
        "metadata": {"name": "q", "namespace": ns},
        "spec": {"hard": {"limits.nvidia.com/gpumem": str(mem)}},
    }


def test_quota_is_freed_only_by_victims_of_the_same_namespace():
    # The card has room, but namespace team's quota (20000) is used up by its own pod (16000): an 8000
    # MiB pod of team fits only once that pod is gone; the other namespace's pod would free nothing.
    cs = ClusterState()
    cs.upsert_node(node("n", cards("n", 2)))
    cs.upsert_quota(quota("team", 20000))
    running(cs, "n", [("GPU-n-0", 16000, 0)], ns="team", prio=10, name="own")
    running(cs, "n", [("GPU-n-1", 30000, 0)], ns="other", prio=0, name="foreign")
    assert victims_of(cs, preemptor(ctr(gpu=1, mem=8000), ns="team")) == ["own"]


def test_quota_that_no_eviction_can_satisfy_leaves_the_node_out():
    cs = ClusterState()
    cs.upsert_node(node("n", cards("n", 1)))
    cs.upsert_quota(quota("team", 4000))
    running(cs, "n", [("GPU-n-0", 30000, 0)], ns="other", name="foreign")
    assert victims_of(cs, preemptor(ctr(gpu=1, mem=8000), ns="team")) is None


# -- PodDisruptionBudgets -------------------------------------------------------------------------------


def pdb(selector, allowed: int, ns: str = "default", disrupted=()) -> DisruptionBudget:
    return DisruptionBudget.from_object(
        {
            "metadata": {"name": "pdb", "namespace": ns},
            "spec": {"selector": selector},
            "status": {
                "disruptionsAllowed": allowed,
                "disruptedPods": {n: "2026-01-01T00:00:00Z" for n in disrupted},
            },
        }
    )


def test_a_victim_protected_by_a_budget_is_avoided_when_another_set_works():
    cs = one_card()
    running(cs, "n", [("GPU-0", 16000, 0)], prio=0, labels={"app": "db"}, name="guarded")
    running(cs, "n", [("GPU-0", 16000, 0)], prio=10, name="free")
    budgets = [pdb({"matchLabels": {"app": "db"}}, 0)]
    assert victims_of(cs, preemptor(ctr(gpu=1, mem=16000)), budgets=budgets) == ["free"]
    plan = cs.plan_preemption(preemptor(ctr(gpu=1, mem=20000)), {"n": None}, budgets=budgets)["n"]
    # 20000 needs both: one budget violation, reported as kube-scheduler's NumPDBViolations.
    assert [v.name for v in plan.victims] == ["free", "guarded"] and plan.pdb_violations == 1


def test_budget_allowance_counts_victims_most_important_first():
    a = Resident("a", "default", "a", priority=5, labels={"app": "x"})
    b = Resident("b", "default", "b", priority=1, labels={"app": "x"})
    one = [pdb({"matchLabels": {"app": "x"}}, 1)]
    # One disruption allowed: the more important pod takes it, the second violates.
    assert pdb_violations([b, a], one) == 1
    # An empty selector covers every pod of its namespace; a nil one none; other namespaces never.
    assert pdb_violations([a, b], [pdb({}, 0)]) == 2
    assert pdb_violations([a, b], [pdb(None, 0)]) == 0
    assert pdb_violations([a, b], [pdb({}, 0, ns="other")]) == 0
    # A pod the API server already counted as disrupted takes no allowance.
    assert pdb_violations([a, b], [pdb({"matchLabels": {"app": "x"}}, 1, disrupted=["a"])]) == 0
    exprs = {"matchExpressions": [{"key": "app", "operator": "In", "values": ["x"]}]}
    assert pdb_violations([a], [pdb(exprs, 0)]) == 1
    notin = {"matchExpressions": [{"key": "app", "operator": "NotIn", "values": ["x"]}]}
    assert pdb_violations([a], [pdb(notin, 0)]) == 0


# -- kube-scheduler's proposal ------------------------------------------------------------------------------


def test_proposed_victims_are_narrowed_and_extended_within_the_node():
    # kube-scheduler counts node-level memory only and proposes b and c (the least important), which
    # are on card 1; the preemptor needs a whole card's worth on one card: a on card 0 is the one.
    cs = ClusterState()
    cs.upsert_node(node("n", cards("n", 2)))
    a_uid = "a-uid"
    cs.upsert_pod(
        {
            "metadata": {
                "uid": a_uid, "name": "a", "namespace": "default",
                "annotations": {A.ASSIGNED_NODE: "n", A.NVIDIA_ALLOCATED: "GPU-n-0,NVIDIA,30000,0:;"},
            },
            "spec": {"schedulerName": "hami-scheduler", "priority": 50, "containers": [ctr(gpu=1, mem=30000)]},
            "status": {"phase": "Running"},
        }
    )  # fmt: skip
    running(cs, "n", [("GPU-n-1", 10000, 0)], name="b")
    running(cs, "n", [("GPU-n-1", 10000, 0)], name="c")
    uids = {r.name: r.uid for r in cs.residents("n")}
    plan = cs.plan_preemption(preemptor(ctr(gpu=1, mem=30000)), {"n": [uids["b"], uids["c"]]})["n"]
    assert [v.name for v in plan.victims] == ["a"]
    assert plan.added == (a_uid,) and set(plan.dropped) == {uids["b"], uids["c"]}


def test_proposed_victims_without_cards_are_kept():
    # A CPU-only pod kube-scheduler proposed (say for memory) stays; the GPU victim is added.
    cs = one_card()
    running(cs, "n", [("GPU-0", 30000, 0)], name="gpu")
    cpu_only = Resident("cpu-uid", "default", "cpu", priority=0)
    p = preemptor(ctr(gpu=1, mem=8000))
    plan = cs.plan_preemption(p, {"n": ["cpu-uid"]}, others={"cpu-uid": cpu_only})["n"]
    assert sorted(v.name for v in plan.victims) == ["cpu", "gpu"] and plan.kept == ("cpu-uid",)


def test_a_terminating_lower_priority_pod_is_a_free_victim():
    # `leaving` is already terminating and still holds its 16000 MiB: it counts as a victim for free,
    # so only one more (the 8000 MiB most recent pod) must go for 20000.
    cs = one_card()
    running(cs, "n", [("GPU-0", 16000, 0)], deleting=True, name="leaving")
    running(cs, "n", [("GPU-0", 8000, 0)], created="2026-01-01T00:00:00Z", name="old")
    running(cs, "n", [("GPU-0", 8000, 0)], created="2026-02-01T00:00:00Z", name="new")
    assert victims_of(cs, preemptor(ctr(gpu=1, mem=20000))) == ["leaving", "new"]


def test_cpu_the_node_lacks_is_freed_too():
    # 8 CPUs, 7 taken by the GPU pods; the preemptor needs 4 CPUs: the 4-CPU pod must go even though
    # the 1-CPU pod's card share alone would do.
    cs = ClusterState()
    n = node("n", cards("n", 1))
    n["status"] = {"allocatable": {"cpu": "8"}}
    cs.upsert_node(n)
    for name, cpu, prio in (("four", "4", 0), ("three", "3", 0)):
        p = {
            "metadata": {
                "uid": name, "name": name, "namespace": "default",
                "annotations": {A.ASSIGNED_NODE: "n", A.NVIDIA_ALLOCATED: "GPU-n-0,NVIDIA,16000,0:;"},
            },
            "spec": {
                "schedulerName": "hami-scheduler", "priority": prio,
                "containers": [{"name": "c", "resources": {"requests": {"cpu": cpu}, "limits": {"nvidia.com/gpu": "1"}}}],
            },
            "status": {"phase": "Running"},
        }  # fmt: skip
        cs.upsert_pod(p)
    p = preemptor(
        {
            "name": "c",
            "resources": {
                "requests": {"cpu": "4"},
                "limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "16000"},
            },
        }
    )
    assert victims_of(cs, p) == ["four"]


def test_the_search_settles_for_kube_schedulers_greedy_set_when_out_of_trials():
    residents = [Resident(f"r{k}", "default", f"r{k}", priority=k) for k in range(6)]

    # The preemptor fits once any three residents are gone.
    def trial(removed):
        from hami.fit import NodeFit

        return NodeFit(ok=len(removed) >= 3)

    exact = choose_victims("n", residents, priority=100, trial=trial)
    assert [v.name for v in exact.victims] == ["r2", "r1", "r0"] and exact.exact
    greedy = choose_victims("n", residents, priority=100, trial=trial, max_trials=5)
    # The greedy reprieve gives back the most important pods first, keeping the three least important.
    assert [v.name for v in greedy.victims] == ["r2", "r1", "r0"] and not greedy.exact


@pytest.mark.parametrize(
    ("value", "expected"),
    [("2026-01-01T00:00:00Z", 1767225600.0), ("", 0.0), (None, 0.0), ("yesterday", 0.0)],
)
def test_parse_time(value, expected):
    assert parse_time(value) == expected


# -- after the plan: deletion, nomination holds ----------------------------------------------------------


def nominated(p: dict, where: str) -> dict:
    return {**p, "status": {"phase": "Pending", "nominatedNodeName": where}}


def test_a_terminating_victim_keeps_its_card_until_it_is_gone():
    # Graceful deletion: the victim's containers still run (and hold the card's memory) until the
    # pod object is removed; only then does the preemptor fit.
    cs = one_card()
    running(cs, "n", [("GPU-0", 30000, 0)], name="victim")
    victim = PODS["victim"]
    p = preemptor(ctr(gpu=1, mem=20000))
    deleting = {**victim, "metadata": {**victim["metadata"], "deletionTimestamp": "2026-01-02T00:00:00Z"}}
    cs.upsert_pod(deleting)  # the MODIFIED event of the DELETE with a grace period
    assert [r.terminating for r in cs.residents("n")] == [True]
    assert cs.filter(p, ["n"]).node is None
    cs.remove_pod(victim["metadata"]["uid"])  # the DELETED event
    assert cs.filter(p, ["n"]).node == "n"


def test_a_nomination_holds_the_freed_card_against_lower_priority_pods():
    cs = ClusterState()
    cs.upsert_node(node("n", cards("n", 1)))
    victim = running(cs, "n", [("GPU-n-0", 30000, 0)], prio=0, name="victim")
    vuid = next(r.uid for r in cs.residents("n") if r.name == victim)
    p = preemptor(ctr(gpu=1, mem=20000), prio=1000)
    plans = cs.plan_preemption(p, {"n": None}, remember=True)
    assert [v.name for v in plans["n"].victims] == ["victim"]
    cs.upsert_pod(nominated(p, "n"))  # kube-scheduler wrote status.nominatedNodeName
    [hold] = cs.holds()
    assert (hold.node, hold.priority, hold.victims) == ("n", 1000, frozenset({vuid}))
    cs.remove_pod(vuid)  # the victim is gone
    # A lower-priority pod would fit on the freed 32768 MiB, but 20000 are held: 12768 is what it sees.
    low = pod(ctr(gpu=1, mem=16000))
    low["spec"]["priority"] = 10
    assert cs.filter(low, ["n"]).node is None
    small = pod(ctr(gpu=1, mem=12000))
    small["spec"]["priority"] = 10
    out = cs.filter(small, ["n"])
    assert out.node == "n"
    cs.remove_pod(small["metadata"]["uid"])
    # A pod of equal priority is held back too, a higher one is not (kube-scheduler's rule for its
    # nominated pods: those of equal or higher priority count).
    peer = pod(ctr(gpu=1, mem=16000))
    peer["spec"]["priority"] = 1000
    assert cs.filter(peer, ["n"]).node is None
    peer["spec"]["priority"] = 1001
    assert cs.filter(peer, ["n"]).node == "n"
    cs.remove_pod(peer["metadata"]["uid"])
    # The nominee itself fits on its freed card; once placed the hold is gone.
    assert cs.filter(p, ["n"]).node == "n"
    assert cs.holds() == []


def test_a_hold_counts_the_nominee_on_top_of_what_victims_still_hold_never_twice():
    # While the victim (30000 of 32768) terminates, the nominee's 20000 replaces it: a lower-priority
    # pod sees max(now 30000, after 20000) = 30000 used, so 2768 MiB free, not 32768 - 50000.
    cs = ClusterState()
    cs.upsert_node(node("n", cards("n", 1)))
    running(cs, "n", [("GPU-n-0", 30000, 0)], prio=0, name="victim")
    p = preemptor(ctr(gpu=1, mem=20000), prio=1000)
    cs.plan_preemption(p, {"n": None}, remember=True)
    cs.upsert_pod(nominated(p, "n"))
    tiny = pod(ctr(gpu=1, mem=2768))
    tiny["spec"]["priority"] = 10
    assert cs.filter(tiny, ["n"]).node == "n"
    assert cs.usage_snapshot()["n"]["GPU-n-0"][1] == 30000 + 2768  # the hold itself reserves nothing


def test_a_cleared_or_moved_nomination_ends_the_hold_and_a_restart_plans_it_again():
    cs = ClusterState()
    cs.upsert_node(node("n", cards("n", 1)))
    cs.upsert_node(node("m", cards("m", 1)))
    running(cs, "n", [("GPU-n-0", 30000, 0)], name="on-n")
    running(cs, "m", [("GPU-m-0", 30000, 0)], name="on-m")
    p = preemptor(ctr(gpu=1, mem=20000))
    # No plan was asked of this state (another replica answered): the nomination makes one.
    cs.upsert_pod(nominated(p, "m"))
    assert [(h.node, len(h.victims)) for h in cs.holds()] == [("m", 1)]
    cs.upsert_pod({**p, "status": {"phase": "Pending"}})
    assert cs.holds() == []
    cs.upsert_pod(nominated(p, "n"))
    cs.remove_pod(p["metadata"]["uid"])  # the preemptor was deleted
    assert cs.holds() == []


def test_a_nomination_whose_victims_are_already_gone_holds_the_room_as_it_is():
    # A restarted extender sees the nomination after the victims left: the pod fits the node as it is,
    # and that room is held for it.
    cs = ClusterState()
    cs.upsert_node(node("n", cards("n", 1)))
    p = preemptor(ctr(gpu=1, mem=20000), prio=1000)
    cs.upsert_pod(nominated(p, "n"))
    [hold] = cs.holds()
    assert (hold.node, hold.victims, [g.usedmem for g in hold.grants]) == ("n", frozenset(), [20000])
    low = pod(ctr(gpu=1, mem=16000))
    low["spec"]["priority"] = 0
    assert cs.filter(low, ["n"]).node is None


def test_a_mig_victim_frees_its_placement():
    """On a card in MIG mode the victim's instance is what blocks the preemptor: removing the victim in
    the trial frees its placement (its memory alone would have fitted)."""
    from hami.model import MigPlacement, MigProfile

    cs = ClusterState()
    profiles = (MigProfile("1g.5gb", 4864, 15, 1, (MigPlacement(6, 1),)),)
    cs.upsert_node(
        node("n", [Device("GPU-0", 0, 7, 40960, 100, "NVIDIA A100", mode="mig", mig_profiles=profiles)])
    )
    name = running(cs, "n", [("GPU-0", 4864, 15)], prio=0)
    PODS[name]["metadata"]["annotations"][A.MIG_ALLOCATIONS] = A.encode_mig_allocations(
        [A.MigAllocation(0, 0, "GPU-0", "1g.5gb", MigPlacement(6, 1))]
    )
    cs.upsert_pod(PODS[name])
    assert (
        cs.filter(preemptor(ctr(gpu=1, mem=4000)), ["n"]).failed_nodes["n"] == "1/1 CardMigTopologyInfeasible"
    )
    assert victims_of(cs, preemptor(ctr(gpu=1, mem=4000))) == [name]
