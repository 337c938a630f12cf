"""Device-aware preemption end to end: the real extender against the in-memory API server, driven by a
kube-scheduler stand-in that follows DefaultPreemption's own sequence (`kubefakes.kube_scheduler`):
filter fails -> the dry run's candidates -> the preempt verb -> victims deleted (gracefully) and the
preemptor nominated -> filter again -> bind.

The cluster (hand-worked numbers): two nodes, one 32768 MiB card each.
- n1 holds a (16000 MiB, 30 %), b (8000, 30 %), c (8000, 30 %), all priority 0: 32000 MiB booked.
- n2 holds d (30000 MiB, 50 %), priority 10.
The preemptor h asks 16000 MiB and 20 % at priority 1000. Per card, n1 needs 16000 - 768 freed: a alone
does it (one pod); b and c together too (two pods). kube-scheduler, counting only the node totals,
reprieves the most important pod first (a, the oldest) and proposes b and c. The extender narrows that to
a: the fewest pods. On n2 only d can go, and d's priority (10) is above a's (0), so kube-scheduler picks
n1.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from hami import annotations as A
from hami.model import Device
from kubefakes.apiserver import FakeApiServer
from kubefakes.kube_scheduler import KubeSchedulerStandIn
from tests.builders import V100, gpu_node, gpu_pod
from tests.integration.extender_harness import (
    create_pod,
    dp_allocated,
    eventually,
    start_extender,
    wait_ready,
)

#: The chart's managed resources that kube-scheduler does not count with preemption on: the card count
#: (the device plugin advertises shares, not cards), the percentage and the priority.
IGNORED_WITH_TOTALS = ("nvidia.com/gpu", "nvidia.com/gpumem-percentage", "nvidia.com/priority")
#: HAMi's chart: every managed resource ignored.
IGNORED_ALL = (*IGNORED_WITH_TOTALS, "nvidia.com/gpumem", "nvidia.com/gpucores")


@pytest.fixture
def fake_apiserver():
    server = FakeApiServer(bookmark_interval_s=0.2, graceful_pod_deletion=True).start()
    try:
        yield server
    finally:
        server.stop()


def card(node: str) -> Device:
    return Device(f"GPU-{node}", 0, 10, 32768, 100, V100)


def pod_of(name: str, *, mem: int, cores: int, prio: int, created: str, pct: int | None = None) -> dict:
    p = gpu_pod(name, mem=None if pct else mem, cores=cores)
    if pct:
        p["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpumem-percentage"] = str(pct)
    p["spec"]["priority"] = prio
    p["spec"]["terminationGracePeriodSeconds"] = 30
    p["metadata"]["creationTimestamp"] = created
    return p


async def allocated(api: FakeApiServer):
    async def after_bind(pod: dict, node: str) -> None:
        dp_allocated(api, pod, node)  # the device plugin's Allocate: bind-phase success, lock released

    return after_bind


@pytest.fixture
async def extender(fake_apiserver: FakeApiServer, request) -> AsyncIterator:
    api = fake_apiserver
    for n in ("n1", "n2"):
        api.store.create("nodes", gpu_node(n, [card(n)]))
    flags = getattr(request, "param", ("--advertise-node-resources",))
    server = await start_extender(api, *flags)
    await wait_ready(server)
    try:
        yield server
    finally:
        await server.stop()


async def start_cluster(api: FakeApiServer, sched: KubeSchedulerStandIn, server) -> None:
    low = [
        ("a", 16000, 30, 0, "2026-01-01T00:00:00Z"),
        ("b", 8000, 30, 0, "2026-01-02T00:00:00Z"),
        ("c", 8000, 30, 0, "2026-01-03T00:00:00Z"),
    ]
    for name, mem, cores, prio, created in low:
        create_pod(api, pod_of(name, mem=mem, cores=cores, prio=prio, created=created))
    # The node policy binpack puts them together: n1 (by name) first, then the fuller node.
    for name, *_ in low:
        assert (await sched.schedule("default", name)).node == "n1"
    create_pod(api, pod_of("d", mem=30000, cores=50, prio=10, created="2026-01-04T00:00:00Z"))
    # d goes to n2 (n1 has 768 MiB left).
    assert (await sched.schedule("default", "d")).node == "n2"
    # The kubelet started them one day apart (the API server stamped their creation just now).
    for name, started in (("a", "2026-01-01"), ("b", "2026-01-02"), ("c", "2026-01-03"), ("d", "2026-01-04")):
        api.store.patch(
            "pods", name, {"status": {"phase": "Running", "startTime": f"{started}T00:00:00Z"}},
            namespace="default", subresource="status",
        )  # fmt: skip
    await eventually(lambda: len(server.state.pod_grants()) == 4, what="four pods counted")
    await eventually(
        lambda: sorted(r.created for r in server.state.residents("n1"))[-1] > 0, what="start times seen"
    )


def placement(api: FakeApiServer, name: str) -> tuple[str | None, str | None]:
    p = api.store.get("pods", name, namespace="default")
    annos = p["metadata"].get("annotations") or {}
    return p["spec"].get("nodeName"), annos.get(A.NVIDIA_ALLOCATED)


def assert_no_card_over_committed(api: FakeApiServer, server) -> None:
    """Every card's booked memory, cores and slots within its capacity, in the extender's state and in
    what the API server's pods say."""
    for s in server.state.card_stats():
        assert s.usedmem <= s.devmem and s.usedcores <= s.devcore and s.used <= s.count, s
    booked: dict[str, int] = {}
    for p in api.store.list("pods"):
        value = (p["metadata"].get("annotations") or {}).get(A.NVIDIA_ALLOCATED)
        if value:
            for cds in A.decode_pod_devices(value):
                for cd in cds:
                    booked[cd.uuid] = booked.get(cd.uuid, 0) + cd.usedmem
    assert all(v <= 32768 for v in booked.values()), booked


@pytest.mark.parametrize("cache_capable", [True, False], ids=["meta-victims", "full-victims"])
async def test_preemptor_runs_on_the_card_its_minimal_victim_freed(
    fake_apiserver: FakeApiServer, extender, session, cache_capable: bool
) -> None:
    api = fake_apiserver
    # The extender advertised the cards' totals: kube-scheduler counts them from now on.
    for n in ("n1", "n2"):
        await eventually(
            lambda n=n: (
                api.store.get("nodes", n)["status"]["allocatable"].get("nvidia.com/gpumem") == "32768"
            ),
            what=f"{n} advertises nvidia.com/gpumem",
        )
    assert api.store.get("nodes", "n2")["status"]["capacity"]["nvidia.com/gpucores"] == "100"
    sched = KubeSchedulerStandIn(
        api, session, extender.url, ignored=IGNORED_WITH_TOTALS, cache_capable=cache_capable,
        after_bind=await allocated(api),
    )  # fmt: skip
    await start_cluster(api, sched, extender)
    create_pod(api, pod_of("h", mem=16000, cores=20, prio=1000, created="2026-02-01T00:00:00Z"))

    first = await sched.schedule("default", "h")
    # kube-scheduler's dry run found victims on both nodes; the preempt verb was called with them.
    assert first.statuses["n1"] == ("Unschedulable", "Insufficient nvidia.com/gpucores")
    assert first.proposed == {"n1": ["b", "c"], "n2": ["d"]}
    uid = {p["metadata"]["name"]: p["metadata"]["uid"] for p in api.store.list("pods")}
    reply = first.preempt_reply["NodeNameToMetaVictims"]
    assert reply == {
        "n1": {"Pods": [{"UID": uid["a"]}], "NumPDBViolations": 0},
        "n2": {"Pods": [{"UID": uid["d"]}], "NumPDBViolations": 0},
    }
    assert (first.result, first.node, first.victims) == ("nominated", "n1", ["a"])
    a = api.store.get("pods", "a", namespace="default")
    assert a["metadata"].get("deletionTimestamp")  # graceful deletion: still running on its card
    assert "DisruptionTarget" in [c["type"] for c in a["status"]["conditions"]]
    assert api.store.get("pods", "h", namespace="default")["status"]["nominatedNodeName"] == "n1"
    await eventually(lambda: [h.node for h in extender.state.holds()] == ["n1"], what="the hold")

    # While a terminates it still holds its 16000 MiB: h does not fit yet, and may not preempt again.
    second = await sched.schedule("default", "h")
    assert second.result == "unschedulable" and "terminating" in second.message
    assert second.preempt_args is None
    # A lower-priority pod that kube-scheduler does not count (memory as a percentage) arrives: it must
    # not get the card h was nominated for, even once a is gone.
    create_pod(api, pod_of("late", mem=0, cores=10, prio=5, created="2026-02-02T00:00:00Z", pct=50))
    api.store.delete("pods", "a", namespace="default")  # the kubelet saw a's containers exit
    await eventually(lambda: uid["a"] not in {r.uid for r in extender.state.residents("n1")}, what="a gone")
    late = await sched.schedule("default", "late")
    assert late.result == "unschedulable", late
    assert late.statuses["n1"][1] == "1/1 CardInsufficientMemory (no card has 50 % of a card's memory free)"

    third = await sched.schedule("default", "h")
    assert (third.result, third.node) == ("bound", "n1")
    node, devices = placement(api, "h")
    assert node == "n1" and devices == "GPU-n1,NVIDIA,16000,20:;"
    # Nobody beyond the minimal set was evicted: b, c and d still run where they were.
    assert {p["metadata"]["name"] for p in api.store.list("pods")} == {"b", "c", "d", "h", "late"}
    assert [placement(api, n)[0] for n in ("b", "c", "d")] == ["n1", "n1", "n2"]
    assert extender.state.holds() == []
    assert_no_card_over_committed(api, extender)
    metrics = (await (await session.get(f"{extender.url}/metrics")).text()).splitlines()
    assert 'hami_scheduler_preempt_total{result="planned"} 1.0' in metrics


@pytest.mark.parametrize("extender", [()], indirect=True, ids=["chart-without-totals"])
async def test_without_counted_totals_kube_scheduler_never_calls_the_preempt_verb(
    fake_apiserver: FakeApiServer, extender, session
) -> None:
    # HAMi's chart ignores every device resource: kube-scheduler's dry run fits h on every node with no
    # victim, drops the nodes (kube-scheduler 1.23-1.33), and the preempt verb is never called.
    api = fake_apiserver
    sched = KubeSchedulerStandIn(
        api, session, extender.url, ignored=IGNORED_ALL, after_bind=await allocated(api)
    )
    await start_cluster(api, sched, extender)
    create_pod(api, pod_of("h", mem=16000, cores=20, prio=1000, created="2026-02-01T00:00:00Z"))
    cycle = await sched.schedule("default", "h")
    assert cycle.statuses["n1"] == ("Unschedulable", "1/1 CardInsufficientMemory (no card has 16000 MiB free)")
    assert (cycle.result, cycle.proposed, cycle.preempt_args) == ("unschedulable", {}, None)
    assert [verb for verb, _ in sched.calls].count("preempt") == 0
    assert "nominatedNodeName" not in api.store.get("pods", "h", namespace="default")["status"]


@pytest.mark.parametrize("extender", [()], indirect=True, ids=["chart-without-totals"])
async def test_with_placeholder_candidates_the_extender_chooses_victims_from_scratch(
    fake_apiserver: FakeApiServer, extender, session
) -> None:
    # kube-scheduler with kubernetes/kubernetes#135486 passes nodes that fit its own filters with no
    # victim to an interested preempt extender as empty candidates: the extender names the victims.
    api = fake_apiserver
    sched = KubeSchedulerStandIn(
        api, session, extender.url, ignored=IGNORED_ALL, placeholders=True, after_bind=await allocated(api)
    )
    await start_cluster(api, sched, extender)
    create_pod(api, pod_of("h", mem=16000, cores=20, prio=1000, created="2026-02-01T00:00:00Z"))
    cycle = await sched.schedule("default", "h")
    assert cycle.proposed == {"n1": [], "n2": []}
    assert (cycle.result, cycle.node, cycle.victims) == ("nominated", "n1", ["a"])
    api.store.delete("pods", "a", namespace="default")
    uid_a = cycle.preempt_reply["NodeNameToMetaVictims"]["n1"]["Pods"][0]["UID"]
    await eventually(lambda: uid_a not in {r.uid for r in extender.state.residents("n1")}, what="a gone")
    assert (await sched.schedule("default", "h")).node == "n1"
    assert placement(api, "h") == ("n1", "GPU-n1,NVIDIA,16000,20:;")
    assert_no_card_over_committed(api, extender)


async def test_a_node_where_no_eviction_frees_a_card_is_left_out(
    fake_apiserver: FakeApiServer, extender, session
):
    # h2 may only use n2's card (UUID rule); n2's d has priority 10 < 1000 and frees it, n1 is left out
    # although kube-scheduler proposed victims there.
    api = fake_apiserver
    await eventually(
        lambda: api.store.get("nodes", "n2")["status"]["allocatable"].get("nvidia.com/gpumem") == "32768",
        what="n2 advertises",
    )
    sched = KubeSchedulerStandIn(
        api, session, extender.url, ignored=IGNORED_WITH_TOTALS, after_bind=await allocated(api)
    )
    await start_cluster(api, sched, extender)
    h2 = pod_of("h2", mem=16000, cores=20, prio=1000, created="2026-02-01T00:00:00Z")
    h2["metadata"]["annotations"]["nvidia.com/use-gpuuuid"] = "GPU-n2"
    create_pod(api, h2)
    cycle = await sched.schedule("default", "h2")
    assert set(cycle.proposed) == {"n1", "n2"}
    assert set(cycle.preempt_reply["NodeNameToMetaVictims"]) == {"n2"}
    assert (cycle.result, cycle.node, cycle.victims) == ("nominated", "n2", ["d"])


async def test_preempt_verb_errors_are_non_200(fake_apiserver: FakeApiServer, extender, session) -> None:
    async def post(body: str) -> tuple[int, str]:
        async with session.post(f"{extender.url}/preempt", data=body) as r:
            return r.status, await r.text()

    status, text = await post("{}")
    assert status == 400 and "ExtenderPreemptionArgs.Pod" in text
    status, text = await post(
        '{"Pod": {"metadata": {"uid": "u", "name": "p"}}, "NodeNameToMetaVictims": null}'
    )
    assert status == 400 and "both missing or null" in text
    body = '{"Pod": {"metadata": {"uid": "u", "name": "p"}}, "NodeNameToMetaVictims": {"n1": {"Pods": [{}]}}}'
    status, text = await post(body)
    assert status == 400 and "ExtenderPreemptionArgs.NodeNameToMetaVictims['n1'].Pods[0].UID: missing" in text
    # A pod asking for no device: nothing to plan, every node dropped.
    ok = '{"Pod": {"metadata": {"uid": "u", "name": "p"}, "spec": {"containers": [{"name": "c"}]}}, "NodeNameToMetaVictims": {"n1": {"Pods": [], "NumPDBViolations": 0}}}'
    status, text = await post(ok)
    assert status == 200 and text.strip() == '{"NodeNameToMetaVictims":{}}'


async def test_a_pod_disruption_budget_moves_the_choice(
    fake_apiserver: FakeApiServer, extender, session
) -> None:
    # A budget with no disruption left covers a: the extender evicts b and c instead (two pods, no
    # violation) rather than a (one pod, one violation).
    api = fake_apiserver
    for n in ("n1", "n2"):
        await eventually(
            lambda n=n: (
                api.store.get("nodes", n)["status"]["allocatable"].get("nvidia.com/gpucores") == "100"
            ),
            what="advertised",
        )
    sched = KubeSchedulerStandIn(
        api, session, extender.url, ignored=IGNORED_WITH_TOTALS, after_bind=await allocated(api)
    )
    await start_cluster(api, sched, extender)
    api.store.patch("pods", "a", {"metadata": {"labels": {"app": "db"}}}, namespace="default")
    pdb = {
        "metadata": {"name": "db", "namespace": "default"},
        "spec": {"selector": {"matchLabels": {"app": "db"}}},
    }
    api.store.create("poddisruptionbudgets", pdb)
    api.store.patch(
        "poddisruptionbudgets",
        "db",
        {"status": {"disruptionsAllowed": 0}},
        namespace="default",
        subresource="status",
    )
    await eventually(
        lambda: any(r.labels.get("app") == "db" for r in extender.state.residents("n1")), what="a's labels"
    )
    create_pod(api, pod_of("h", mem=16000, cores=20, prio=1000, created="2026-02-01T00:00:00Z"))
    cycle = await sched.schedule("default", "h")
    assert (cycle.result, cycle.node, cycle.victims) == ("nominated", "n1", ["b", "c"])
    assert cycle.preempt_reply["NodeNameToMetaVictims"]["n1"]["NumPDBViolations"] == 0


async def test_totals_are_advertised_again_after_the_kubelet_zeroed_them(
    fake_apiserver: FakeApiServer, extender
):
    # A re-created node's kubelet resets extended resources to 0 until someone advertises them.
    api = fake_apiserver
    path = lambda: api.store.get("nodes", "n1")["status"]  # noqa: E731
    await eventually(lambda: path()["capacity"].get("nvidia.com/gpumem") == "32768", what="advertised")
    zero = {"nvidia.com/gpumem": "0", "nvidia.com/gpucores": "0"}
    api.store.patch("nodes", "n1", {"status": {"capacity": zero, "allocatable": zero}}, subresource="status")
    await eventually(
        lambda: path()["allocatable"].get("nvidia.com/gpumem") == "32768", what="advertised again"
    )
    assert path()["allocatable"]["nvidia.com/gpucores"] == "100"
    assert path()["allocatable"]["cpu"] == "64"  # the kubelet's own resources untouched
