"""`hami explain` for a pending pod that outranks running pods: which pods the extender's preempt verb
would name on each node, and the node kube-scheduler would evict on."""

from __future__ import annotations

from datetime import UTC, datetime

from hami import annotations as A
from hami.model import Device
from hami.tools.explain import explain_pod
from hami.tools.render import explain_dict, render_explain
from hami.tools.snapshot import Listed, Snapshot
from tests.builders import V100, gpu_node

NOW = datetime(2026, 3, 1, tzinfo=UTC)


def running(name: str, node: str, mem: int, prio: int) -> dict:
    return {
        "metadata": {
            "uid": f"uid-{name}", "name": name, "namespace": "ml",
            "creationTimestamp": "2026-01-01T00:00:00Z",
            "annotations": {A.ASSIGNED_NODE: node, A.NVIDIA_ALLOCATED: f"GPU-{node},NVIDIA,{mem},10:;"},
        },
        "spec": {
            "schedulerName": "hami-scheduler", "nodeName": node, "priority": prio,
            "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": str(mem)}}}],
        },
        "status": {"phase": "Running"},
    }  # fmt: skip


def pending(prio: int, **spec) -> dict:
    return {
        "metadata": {"uid": "uid-h", "name": "h", "namespace": "ml"},
        "spec": {
            "schedulerName": "hami-scheduler", "priority": prio, **spec,
            "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "20000"}}}],
        },
        "status": {"phase": "Pending"},
    }  # fmt: skip


def snapshot(*pods: dict) -> Snapshot:
    nodes = [gpu_node(n, [Device(f"GPU-{n}", 0, 10, 32768, 100, V100)]) for n in ("n1", "n2")]
    return Snapshot.build(Listed(nodes, list(pods)), now=NOW)


def test_explain_names_the_victims_per_node_and_the_one_kube_scheduler_picks():
    # n1: a (priority 0) holds 30000 of 32768; n2: b (priority 10) the same. h (1000) needs 20000.
    snap = snapshot(running("a", "n1", 30000, 0), running("b", "n2", 30000, 10), pending(1000))
    ex = explain_pod(snap, "ml", "h")
    assert ex.status == "pending" and ex.priority == 1000
    assert [(o.node, o.victims, o.chosen) for o in ex.preemption] == [
        ("n1", ["ml/a"], True),
        ("n2", ["ml/b"], False),
    ]
    text = render_explain(ex, "table", style=_Plain())
    assert (
        "preemption (priority 1000): kube-scheduler would evict on the first node\n  * n1: ml/a\n  - n2: ml/b"
        in text
    )
    assert explain_dict(ex)["preemption"]["options"][0] == {
        "node": "n1",
        "victims": ["ml/a"],
        "pdbViolations": 0,
        "chosen": True,
    }
    # Nothing was changed by the trials.
    assert snap.state.usage_snapshot() == {"n1": {"GPU-n1": (1, 30000, 10)}, "n2": {"GPU-n2": (1, 30000, 10)}}


def test_explain_says_why_nothing_would_be_preempted():
    # The only lower-priority pod holds 2000 MiB: evicting it leaves too little for 20000.
    snap = snapshot(running("big", "n1", 28000, 1000), running("small", "n1", 2000, 0),
                    running("peer", "n2", 30000, 1000), pending(1000))  # fmt: skip
    ex = explain_pod(snap, "ml", "h")
    assert ex.preemption == [] and "frees no card" in ex.preemption_note
    never = explain_pod(
        snapshot(
            running("a", "n1", 30000, 0),
            running("b", "n2", 30000, 0),
            pending(1000, preemptionPolicy="Never"),
        ),
        "ml",
        "h",
    )
    assert never.preemption == [] and never.preemption_note.startswith("preemptionPolicy Never")


class _Plain:
    enabled = False

    def bad(self, s: str) -> str:
        return s

    good = warn = bad
