"""`hami explain` for each fit reason of the core: the reason is named, the node counts add up to the nodes
listed, and every "what would change it" is right: the change is applied to the objects here (new limits,
annotations removed, pods deleted), a fresh state is rebuilt from them and the real filter places the pod.

Also the sentences of `hami.reasons` that the extender's events carry.
"""

from __future__ import annotations

import copy
from collections import Counter
from typing import Any

import pytest

from hami.cluster import ClusterState
from hami.model import ContainerRequest
from hami.pods import ContainerKind, ContainerSpec
from hami.reason_words import Reason
from hami.reasons import humanize, parse_reason_text, sentence
from hami.tools.explain import explain_pod
from hami.tools.snapshot import Listed, Snapshot
from kubefakes.demo_cluster import DEMO_NOW, V100, cards, limits, node, pod

NS = "default"


def _node(name: str, n: int = 2, **kw: Any) -> dict[str, Any]:
    ann = kw.pop("annotations", None)
    return node(name, cards(name, n, 32768, V100, **kw), now=DEMO_NOW, annotations=ann)


def _uuid(name: str, i: int) -> str:
    return f"GPU-{name}-{i}"


def _holder(
    pname: str, uuid: str, mem: int, cores: int, *, ns: str = NS, node_name: str = "n1"
) -> dict[str, Any]:
    return pod(ns, pname, [("c", limits(1, mem, cores))], node=node_name, cards=[[(uuid, mem, cores)]])


def _pending(lim: dict[str, str], annotations: dict[str, str] | None = None, ns: str = NS) -> dict[str, Any]:
    return pod(ns, "wants", [("main", lim)], annotations=annotations)


def _quota(ns: str, mib: int) -> dict[str, Any]:
    return {"kind": "ResourceQuota", "metadata": {"name": "q", "namespace": ns},
            "spec": {"hard": {"limits.nvidia.com/gpumem": str(mib)}}}  # fmt: skip


CPU_NODE = node("cpu-0", [], now=DEMO_NOW)

# reason -> (objects, pending pod)
CASES: dict[Reason, tuple[list[dict[str, Any]], dict[str, Any]]] = {
    Reason.CARD_NOT_HEALTH: (
        [
            node(
                "n1",
                [*cards("n1", 1, 32768, V100, health=False)] + [cards("n1", 2, 32768, V100)[1]],
                now=DEMO_NOW,
            ),
            _holder("big", _uuid("n1", 1), 30000, 0),
        ],
        _pending(limits(1, 8000, 10)),
    ),
    Reason.CARD_CORDONED: (
        [
            _node("n1", annotations={"hami.io/device-cordon": _uuid("n1", 0)}),
            _holder("big", _uuid("n1", 1), 30000, 0),
        ],
        _pending(limits(1, 8000, 10)),
    ),
    Reason.CARD_TYPE_MISMATCH: (
        [_node("n1")],
        _pending(limits(1, 8000, 10), {"nvidia.com/use-gputype": "A100"}),
    ),
    Reason.NUMA_NOT_FIT: (
        [node("n1", cards("n1", 2, 32768, V100, numa=(0, 1)), now=DEMO_NOW)],
        _pending(limits(2, 8000, 10), {"nvidia.com/numa-bind": "true"}),
    ),
    Reason.CARD_UUID_MISMATCH: (
        [_node("n1")],
        _pending(limits(1, 8000, 10), {"nvidia.com/use-gpuuuid": "GPU-other"}),
    ),
    Reason.CARD_TIME_SLICING_EXHAUSTED: (
        [
            _node("n1", 1, count=2),
            _holder("a", _uuid("n1", 0), 1000, 10),
            _holder("b", _uuid("n1", 0), 2000, 10),
        ],
        _pending(limits(1, 1000, 10)),
    ),
    Reason.EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT: (
        [_node("n1", 1), _holder("a", _uuid("n1", 0), 1000, 0)],
        _pending(limits(1, 8000, 100)),
    ),
    Reason.RESOURCE_QUOTA_NOT_FIT: (
        [_node("n1", 1), _holder("a", _uuid("n1", 0), 8000, 10), _quota(NS, 10000)],
        _pending(limits(1, 4000, 10)),
    ),
    Reason.CARD_INSUFFICIENT_MEMORY: (
        [_node("n1", 1), _holder("a", _uuid("n1", 0), 30000, 10)],
        _pending(limits(1, 8000, 10)),
    ),
    Reason.CARD_INSUFFICIENT_CORE: (
        [_node("n1", 1), _holder("a", _uuid("n1", 0), 1000, 80)],
        _pending(limits(1, 1000, 30)),
    ),
    Reason.CARD_COMPUTE_UNITS_EXHAUSTED: (
        [_node("n1", 1), _holder("a", _uuid("n1", 0), 1000, 60), _holder("b", _uuid("n1", 0), 1000, 40)],
        _pending(limits(1, 1000, None)),
    ),
    Reason.ALLOCATED_CARDS_INSUFFICIENT_REQUEST: (
        [_node("n1", 2), _holder("a", _uuid("n1", 0), 30000, 10)],
        _pending(limits(2, 8000, 10)),
    ),
    Reason.NODE_INSUFFICIENT_DEVICE: ([_node("n1", 1)], _pending(limits(2, 1000, 10))),
}


def _snapshot(objs: list[dict[str, Any]]) -> Snapshot:
    kind = lambda k: [copy.deepcopy(o) for o in objs if o["kind"] == k]  # noqa: E731
    return Snapshot.build(Listed(kind("Node"), kind("Pod"), kind("ResourceQuota")), now=DEMO_NOW)


def _apply(
    objs: list[dict[str, Any]], pending: dict[str, Any], s: Any
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The suggestion applied the way a user would: edit the pod's limits or annotations, or delete pods."""
    p = copy.deepcopy(pending)
    for c in p["spec"]["containers"]:
        for k, v in s.limits.get(c["name"], {}).items():
            c["resources"]["limits"][k] = v
            c["resources"]["requests"][k] = v
    for k in s.remove_annotations:
        del p["metadata"]["annotations"][k]
    gone = set(s.end_pods)
    kept = [o for o in objs if f"{o['metadata'].get('namespace')}/{o['metadata']['name']}" not in gone]
    assert len(kept) == len(objs) - len(gone), "every pod to end exists"
    return kept, p


@pytest.mark.parametrize("reason", list(CASES), ids=lambda r: r.value)
def test_explain_names_the_reason_counts_add_up_and_the_changes_work(reason: Reason) -> None:
    objs, pending = CASES[reason]
    objs = [*objs, CPU_NODE]
    snap = _snapshot([*objs, pending])
    ex = explain_pod(snap, NS, "wants")
    assert ex.status == "pending", ex
    named = [g for g in ex.groups if reason.value in g.reason]
    assert named, [g.reason for g in ex.groups]
    assert sum(len(g.nodes) for g in ex.groups) == ex.nodes == 2
    assert sorted(n for g in ex.groups for n in g.nodes) == ["cpu-0", "n1"]
    # The filter itself is unchanged by explaining: the same pod still does not fit, nothing reserved.
    assert snap.state.filter(pending, ["n1"]).node is None
    assert ex.suggestions, f"no change found for {reason.value}"
    for s in ex.suggestions:
        changed_objs, changed_pod = _apply(objs, pending, s)
        fresh = _snapshot([*changed_objs, changed_pod])
        placed = fresh.state.filter(changed_pod, ["n1", "cpu-0"])
        assert placed.node == s.node, (s, placed.failed_nodes)


def test_not_every_reason_has_a_cure() -> None:
    """A card that is unhealthy and nothing else on the node: no change of the pod helps, none is offered."""
    objs = [node("n1", cards("n1", 1, 32768, V100, health=False), now=DEMO_NOW)]
    ex = explain_pod(_snapshot([*objs, _pending(limits(1, 1000, 10))]), NS, "wants")
    assert [g.reason for g in ex.groups] == ["1/1 CardNotHealth"]
    assert ex.groups[0].words == "every card unhealthy"
    assert ex.suggestions == []


def test_quota_is_shown_when_it_is_the_cause() -> None:
    objs, pending = CASES[Reason.RESOURCE_QUOTA_NOT_FIT]
    ex = explain_pod(_snapshot([*objs, pending]), NS, "wants")
    assert ex.quota == [("nvidia.com/gpumem", 8000, 10000)]
    assert [s.limits for s in ex.suggestions if s.kind == "memory"] == [
        {"main": {"nvidia.com/gpumem": "2000"}}
    ]


def test_whole_card_request_reads_as_such() -> None:
    objs = [_node("n1", 2), _holder("a", _uuid("n1", 0), 1000, 10), _holder("b", _uuid("n1", 1), 1000, 10)]
    ex = explain_pod(_snapshot([*objs, _pending(limits(1, None, None))]), NS, "wants")
    (g,) = [g for g in ex.groups if "n1" in g.nodes]
    assert g.reason == "2/2 CardInsufficientMemory"
    assert g.words == "asks a whole card (no gpumem given); every card has sharers"
    assert "largest free: 31768 MiB on n1/GPU-n1-1" in g.detail


def test_scheduled_pod_shows_its_cards_and_the_other_nodes() -> None:
    objs = [_node("n1", 1), _node("n2", 1), _holder("a", _uuid("n1", 0), 8000, 10)]
    ex = explain_pod(_snapshot(objs), NS, "a")
    assert ex.status == "scheduled" and ex.node == "n1"
    assert ex.cards == {"c": ["GPU-n1-0 8000 MiB 10 %"]}
    assert [(r.node, r.fits) for r in ex.runners_up] == [("n2", True)]


def test_webhook_rejection_is_reported() -> None:
    bad = _pending(limits(1, 1000, 10), {"hami.io/gpu-scheduler-policy": "fastest"})
    ex = explain_pod(_snapshot([_node("n1"), bad]), NS, "wants")
    assert ex.status == "rejected"
    assert "unknown policy 'fastest'" in ex.message


# -- sentences --------------------------------------------------------------------------------------


def _spec(*reqs: ContainerRequest) -> list[ContainerSpec]:
    return [ContainerSpec("c", ContainerKind.APP, reqs)]


def test_parse_reason_text_round_trips_the_fit_text() -> None:
    assert parse_reason_text("1/4 CardInsufficientMemory, 3/4 CardTimeSlicingExhausted") == (
        Counter({Reason.CARD_INSUFFICIENT_MEMORY: 1, Reason.CARD_TIME_SLICING_EXHAUSTED: 3}), 4)  # fmt: skip
    assert parse_reason_text("node unregistered") is None
    assert parse_reason_text("2/2 NoSuchWord") is None


@pytest.mark.parametrize(
    ("text", "req", "want"),
    [
        (
            "1/1 NodeInsufficientDevice",
            ContainerRequest("NVIDIA", 2, 1000),
            "needs 2 distinct cards, node has 1",
        ),
        (
            "4/4 CardInsufficientMemory",
            ContainerRequest("NVIDIA", 1, 0, 100),
            "asks a whole card (no gpumem given); every card has sharers",
        ),
        (
            "1/4 CardInsufficientMemory, 3/4 CardTimeSlicingExhausted",
            ContainerRequest("NVIDIA", 1, 0, 100),
            "asks a whole card (no gpumem given); 1 of 4 cards have sharers; every share taken on 3 cards".replace(
                "every share taken on 3 cards", "3 cards with every share taken (deviceSplitCount reached)"
            ),
        ),
        ("2/2 CardInsufficientMemory", ContainerRequest("NVIDIA", 1, 8000), "no card has 8000 MiB free"),
        (
            "1/2 CardInsufficientCore, 1/2 CardNotHealth",
            ContainerRequest("NVIDIA", 1, 8000, coresreq=50),
            "1 card without enough free cores; 1 card unhealthy",
        ),
    ],
)
def test_sentences(text: str, req: ContainerRequest, want: str) -> None:
    parsed = parse_reason_text(text)
    assert parsed is not None
    assert sentence(*parsed, _spec(req)) == want
    assert humanize(text, _spec(req)) == f"{text} ({want})"


def test_humanize_leaves_other_texts_alone() -> None:
    assert humanize("node unregistered", _spec(ContainerRequest("NVIDIA", 1))) == "node unregistered"


def test_cluster_state_unchanged_by_explain_trials() -> None:
    objs, pending = CASES[Reason.CARD_INSUFFICIENT_MEMORY]
    snap = _snapshot([*objs, pending])
    before = snap.state.usage_snapshot()
    explain_pod(snap, NS, "wants")
    assert snap.state.usage_snapshot() == before
    fresh = ClusterState()
    fresh.rebuild([o for o in objs if o["kind"] == "Node"], [o for o in objs if o["kind"] == "Pod"])
    assert fresh.usage_snapshot() == before


def test_the_extenders_event_says_it_in_words() -> None:
    from scheduler_extender.events import filtering_failed_message

    failed = {
        "n1": "1/1 NodeInsufficientDevice",
        "n2": "1/1 NodeInsufficientDevice",
        "ghost": "node unregistered",
    }
    msg = filtering_failed_message(failed, containers=_spec(ContainerRequest("NVIDIA", 2, 1000)))
    assert msg == (
        "no available node, 3 nodes do not meet: 2 nodes 1/1 NodeInsufficientDevice (needs 2 distinct cards, "
        "node has 1) (n1, n2); 1 node node unregistered (ghost)"
    )
    assert filtering_failed_message(failed) == (
        "no available node, 3 nodes do not meet: 2 nodes 1/1 NodeInsufficientDevice (n1, n2); 1 node node "
        "unregistered (ghost)"
    )


def test_a_pod_of_another_scheduler_is_named_as_such() -> None:
    p = _pending(limits(1, 1000, 10))
    p["spec"]["schedulerName"] = "default-scheduler"
    ex = explain_pod(_snapshot([_node("n1"), p]), NS, "wants")
    assert ex.status == "other-scheduler"
    assert ex.message.startswith("spec.schedulerName is 'default-scheduler', not 'hami-scheduler'")


def test_a_pod_bound_by_hand_is_named_as_such() -> None:
    p = _pending(limits(1, 1000, 10))
    p["spec"]["nodeName"] = "n1"
    ex = explain_pod(_snapshot([_node("n1"), p]), NS, "wants")
    assert (ex.status, ex.node) == ("bypassed", "n1")


def test_resources_written_as_annotations_are_flagged() -> None:
    p = _pending(limits(1, None, None), {"nvidia.com/gpumem": "4000"})
    objs = [_node("n1", 1), _holder("a", _uuid("n1", 0), 1000, 10)]
    ex = explain_pod(_snapshot([*objs, p]), NS, "wants")
    assert ex.status == "pending"
    assert ex.warnings[0].startswith(
        "nvidia.com/gpumem is a pod annotation here; only resources.limits count"
    )
    assert ex.groups[0].words == "asks a whole card (no gpumem given); every card has sharers"


def test_a_pending_pod_that_fits_now_is_said_to_fit() -> None:
    ex = explain_pod(_snapshot([_node("n1", 1), _pending(limits(1, 1000, 10))]), NS, "wants")
    assert (ex.status, ex.node) == ("fits-now", "n1")
    assert ex.message == "fits now on n1: the scheduler places it at its next retry"
