"""hami.fragmentation: the fragmentation measure on hand-computed cases, the memoised path against a full
recomputation, the learned workload, and the `fragmentation` policy in ClusterState."""

from __future__ import annotations

import math
import random
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hami import annotations as A
from hami.cluster import ClusterState
from hami.config import DeviceConfig
from hami.fragmentation import (
    FragmentationModel,
    Shape,
    WorkloadHistogram,
    containers_on,
    node_fragmentation,
    packed_fragmentation,
    pod_cpu_milli,
    serves,
    total_variation,
    usage_of,
)
from hami.model import Device, DeviceUsage
from hami.registration import encode_node_devices_json
from hami.scoring import CardPolicy, NodePolicy, choose_policies, parse_card_policy, parse_node_policy

HALF = Shape(1, 0, 50, 50)  # half a card: 50 % of memory and cores
WHOLE = Shape(1, 0, 100, 100)
TWO = Shape(2, 0, 100, 100)


def card(i: int, mib: int = 16384, model: str = "T4", count: int = 10) -> Device:
    return Device(f"GPU-{i}", i, count, mib, 100, f"NVIDIA-{model}")


def used(cores: int, mib: int = 16384, slots: int = 1) -> DeviceUsage:
    return DeviceUsage(slots if cores else 0, mib * cores // 100, cores)


def look(usages):
    return lambda uuid: usages.get(uuid, DeviceUsage())


# ----------------------------------------------------------------------------------------------
# the paper's measure, by hand


def test_paper_measure_single_card_shapes():
    # Card 0 idle (free 1.0), card 1 70 % used (free 0.3).
    devs = [card(0), card(1)]
    u = look({"GPU-1": used(70)})
    # Half share: card 1's 0.3 cannot take 0.5 -> 0.3 is a fragment; card 0 serves it.
    assert node_fragmentation(devs, u, {HALF: 1.0}) == pytest.approx(0.3)
    # Whole card: only the idle card serves it -> again 0.3.
    assert node_fragmentation(devs, u, {WHOLE: 1.0}) == pytest.approx(0.3)
    # A 0.2 share fits on both cards: nothing is a fragment.
    assert node_fragmentation(devs, u, {Shape(1, 0, 20, 20): 1.0}) == 0
    # Expected value over the mix: 0.5 x 0.3 + 0.25 x 0.3 + 0.25 x 0.
    mix = {HALF: 0.5, WHOLE: 0.25, Shape(1, 0, 20, 20): 0.25}
    assert node_fragmentation(devs, u, mix) == pytest.approx(0.225)


def test_paper_measure_task_that_cannot_run_counts_every_free_share():
    devs = [card(0), card(1)]
    u = look({"GPU-1": used(70)})
    # Two whole cards: one idle card only -> the shape cannot run: 1.0 + 0.3 are fragments.
    assert node_fragmentation(devs, u, {TWO: 1.0}) == pytest.approx(1.3)
    # Not enough CPU on the node for the shape: every free share is a fragment.
    assert node_fragmentation(devs, u, {HALF._replace(cpu=8000): 1.0}, cpu_free=4000) == pytest.approx(1.3)
    assert node_fragmentation(devs, u, {HALF._replace(cpu=8000): 1.0}, cpu_free=8000) == pytest.approx(0.3)


def test_hami_sharing_rules_decide_what_a_card_serves():
    d = card(0)
    # Cores free but the memory taken by another tenant: no half share fits.
    assert not serves(d, DeviceUsage(1, 16000, 10), HALF)
    # All slots taken.
    assert not serves(card(0, count=2), DeviceUsage(2, 0, 0), HALF)
    # A whole-card request needs an idle card (exclusive 100 %).
    assert not serves(d, DeviceUsage(1, 0, 0), WHOLE)
    # Model rule: a shape allowed on V100 only is not served by a T4.
    assert not serves(d, DeviceUsage(), HALF._replace(types=("v100",)))
    assert serves(card(0, model="V100M32"), DeviceUsage(), HALF._replace(types=("v100",)))
    # Memory in MiB: 8000 MiB fits an idle 16384 MiB card twice, cores allow 5 of 20 %.
    assert containers_on(d, DeviceUsage(), Shape(1, 8000, 0, 20)) == 2
    assert containers_on(d, DeviceUsage(), Shape(1, 1000, 0, 20)) == 5


def test_packed_measure_counts_residues_and_cpu_starved_cards():
    devs = [card(0)]
    # A card with 0.9 free serves one half share; the other 0.4 is lost to that shape.
    assert packed_fragmentation(devs, look({"GPU-0": used(10)}), {HALF: 1.0}) == pytest.approx(0.4)
    # The paper's per-card test sees no fragment there.
    assert node_fragmentation(devs, look({"GPU-0": used(10)}), {HALF: 1.0}) == 0
    # Four idle cards and CPU for one 8-core pod: three cards cannot be used.
    four = [card(i) for i in range(4)]
    s = WHOLE._replace(cpu=8000)
    assert packed_fragmentation(four, look({}), {s: 1.0}, cpu_free=10000) == pytest.approx(3.0)
    assert packed_fragmentation(four, look({}), {s: 1.0}) == 0
    # The CPU term: 4 idle cards and 24 cores at 12 cores per card of the workload: 2 cards it cannot feed.
    assert (
        packed_fragmentation(four, look({}), {WHOLE: 1.0}, cpu_free=24000, cpu_weight=0.5, cpu_per_card=12000)
        == 1.0
    )
    assert (
        packed_fragmentation(four, look({}), {WHOLE: 1.0}, cpu_free=96000, cpu_weight=0.5, cpu_per_card=12000)
        == 0
    )
    # For whole cards without a CPU limit it is the paper's measure.
    u = look({"GPU-1": used(70), "GPU-2": used(100)})
    dist = {WHOLE: 0.6, TWO: 0.4}
    assert packed_fragmentation(four, u, dist) == pytest.approx(node_fragmentation(four, u, dist))


# ----------------------------------------------------------------------------------------------
# memoised == recomputed


SHAPES = [
    HALF,
    WHOLE,
    TWO,
    Shape(1, 0, 25, 25, (), 4000),
    Shape(1, 6000, 0, 30, ("t4",), 2000),
    Shape(4, 0, 100, 100, (), 32000),
    Shape(1, 0, 81, 81, (), 3000),
]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    weights=st.lists(st.integers(1, 9), min_size=len(SHAPES), max_size=len(SHAPES)),
    ops=st.lists(st.tuples(st.integers(0, 5), st.integers(0, len(SHAPES) - 1), st.booleans()), max_size=40),
    cpu=st.one_of(st.none(), st.integers(0, 64000)),
)
def test_memoised_value_and_delta_equal_a_full_recomputation(weights, ops, cpu):
    z = sum(weights)
    dist = {s: w / z for s, w in zip(SHAPES, weights, strict=True)}
    model = FragmentationModel(WorkloadHistogram(dist, prior_weight=1.0))
    devs = [card(i, model="T4" if i % 2 else "V100M32", mib=15360 if i % 2 else 32768) for i in range(6)]
    usage: dict[str, DeviceUsage] = {}
    held: list[tuple[str, int, int]] = []
    for i, k, release in ops:
        if release and held:
            uuid, mem, cores = held.pop(0)
            usage[uuid].sub(mem, cores)
        else:
            d, s = devs[i], SHAPES[k]
            u = usage.setdefault(d.uuid, DeviceUsage())
            if serves(d, u, s):
                u.add(s.mem_on(d.devmem), s.cores)
                held.append((d.uuid, s.mem_on(d.devmem), s.cores))
        get = usage_of(usage)
        ref_cpu = math.inf if cpu is None else cpu
        assert model.node_value(devs, get, cpu) == pytest.approx(
            packed_fragmentation(devs, get, dist, ref_cpu)
        )
    # The placement delta of a single-card shape is the best card's recomputed increase.
    get = usage_of(usage)
    for s in SHAPES:
        if s.nums != 1 or (cpu is not None and s.cpu > cpu):
            continue  # kube-scheduler's CPU fit keeps such a pod off the node
        best = None
        for d in devs:
            u = get(d.uuid)
            if not serves(d, u, s):
                continue
            after = dict(usage)
            after[d.uuid] = DeviceUsage(u.used + 1, u.usedmem + s.mem_on(d.devmem), u.usedcores + s.cores)
            c0 = math.inf if cpu is None else cpu
            c1 = math.inf if cpu is None else cpu - s.cpu
            x = packed_fragmentation(devs, usage_of(after), dist, c1) - packed_fragmentation(
                devs, get, dist, c0
            )
            best = x if best is None else min(best, x)
        got = model.placement_delta(devs, get, s, cpu)
        assert (got is None) == (best is None)
        if best is not None:
            assert got == pytest.approx(best)


# ----------------------------------------------------------------------------------------------
# the learned workload


def test_histogram_converges_on_a_stationary_stream_and_the_prior_fades():
    truth = {HALF: 0.5, WHOLE: 0.3, TWO: 0.2}
    h = WorkloadHistogram({Shape(8, 0, 100, 100): 1.0}, prior_weight=64, half_life=2000)
    assert h.distribution() == {Shape(8, 0, 100, 100): 1.0}
    rng = random.Random(7)
    shapes, p = list(truth), list(truth.values())
    for _ in range(20000):
        h.observe(rng.choices(shapes, p)[0])
    got = h.distribution()
    assert total_variation(got, truth) < 0.04, got
    assert got.get(Shape(8, 0, 100, 100), 0) < 1e-3  # the prior is 10 half-lives old


def test_histogram_follows_a_change_of_workload():
    h = WorkloadHistogram({}, prior_weight=0, half_life=500)
    for _ in range(3000):
        h.observe(HALF)
    for _ in range(3000):
        h.observe(WHOLE)
    assert h.distribution()[WHOLE] > 0.98


def test_model_refreshes_only_on_drift_and_ignores_a_uid_seen_twice():
    m = FragmentationModel(WorkloadHistogram({HALF: 1.0}, prior_weight=10), check_every=10, drift=0.05)
    v = m.version
    assert m.observe([HALF], uid="a") and not m.observe([HALF], uid="a")
    for i in range(30):
        m.observe([HALF], uid=f"h{i}")
    assert m.version == v  # nothing changed: memoised terms stay
    for i in range(40):
        m.observe([WHOLE], uid=f"w{i}")
    assert m.version > v and m.active[WHOLE] > 0.1  # the workload moved: a refresh
    # Weighted by count / cards squared: each half share counts 4, each whole card 1, the prior 10
    # (decay over 71 observations with a half-life of 4000 is under 1.3 %).
    assert m.histogram.distribution()[WHOLE] == pytest.approx(40 / (40 + 10 + 4 * 31), rel=0.02)


def test_bad_histogram_arguments_are_named():
    with pytest.raises(ValueError, match="half_life"):
        WorkloadHistogram(half_life=0)
    with pytest.raises(ValueError, match="prior_weight"):
        WorkloadHistogram(prior_weight=-1)


def test_pod_cpu_is_counted_as_kube_scheduler_does():
    pod = {
        "spec": {
            "initContainers": [{"name": "i", "resources": {"requests": {"cpu": "3"}}}],
            "containers": [
                {"name": "a", "resources": {"requests": {"cpu": "500m"}}},
                {"name": "b", "resources": {"limits": {"cpu": "1"}}},
                {"name": "c", "resources": {"requests": {"cpu": "bad"}}},
            ],
        }
    }
    assert pod_cpu_milli(pod) == 3000  # the init container (3) is larger than 0.5 + 1 running
    pod["spec"]["initContainers"] = []
    assert pod_cpu_milli(pod) == 1500


# ----------------------------------------------------------------------------------------------
# the policy in the core


def test_policy_names_parse_for_node_card_and_pod():
    assert parse_node_policy("Fragmentation") is NodePolicy.FRAGMENTATION
    assert parse_card_policy("fragmentation,numa") == (CardPolicy.FRAGMENTATION, CardPolicy.NUMA)
    choice = choose_policies(
        {A.NODE_SCHEDULER_POLICY: "fragmentation", A.GPU_SCHEDULER_POLICY: "fragmentation"},
        node_default="binpack",
        card_default="spread",
    )
    assert choice.uses_fragmentation and not choice.warnings


def reg_node(name: str, cards: list[Device], cpu: str = "64") -> dict:
    return {
        "metadata": {"name": name, "annotations": {A.NVIDIA_REGISTER: encode_node_devices_json(cards)}},
        "status": {"allocatable": {"cpu": cpu}},
    }


def share_pod(uid: str, pct: int, cpu: str = "1") -> dict:
    limits = {
        "nvidia.com/gpu": "1",
        "nvidia.com/gpucores": str(pct),
        "nvidia.com/gpumem-percentage": str(pct),
    }
    return {
        "metadata": {"name": uid, "namespace": "default", "uid": uid, "annotations": {}},
        "spec": {
            "schedulerName": "hami-scheduler",
            "containers": [{"name": "c", "resources": {"limits": limits, "requests": {"cpu": cpu}}}],
        },
    }


def frag_state() -> ClusterState:
    cfg = DeviceConfig()
    sched = replace(cfg.scheduler, nodeSchedulerPolicy="fragmentation", gpuSchedulerPolicy="fragmentation")
    return ClusterState(config=replace(cfg, scheduler=sched))


def test_fragmentation_fills_the_gap_a_share_fits_best():
    cs = frag_state()
    cs.upsert_node(reg_node("a", [Device(f"a{i}", i, 10, 16384, 100, "NVIDIA-T4") for i in range(2)]))
    cs.upsert_node(reg_node("b", [Device("b0", 0, 10, 16384, 100, "NVIDIA-T4")]))
    # 50 % on node b's card, then another 50 %: it completes that card instead of opening one on a.
    assert cs.filter(share_pod("p1", 50), ["a", "b"]).node in ("a", "b")
    first = cs.usage_snapshot()
    second = cs.filter(share_pod("p2", 50), ["a", "b"])
    ((node, cards),) = ((n, c) for n, c in first.items() if c)
    assert second.node == node
    assert cs.usage_snapshot()[node] == {next(iter(cards)): (2, 16384, 100)}


def test_fragmentation_keeps_cpu_for_the_cards_of_a_node():
    cs = frag_state()
    # Node "rich" has one card and plenty of CPU; node "tight" two cards and CPU for about one pod.
    cs.upsert_node(reg_node("rich", [Device("r0", 0, 10, 16384, 100, "NVIDIA-T4")], cpu="64"))
    cs.upsert_node(
        reg_node("tight", [Device(f"t{i}", i, 10, 16384, 100, "NVIDIA-T4") for i in range(2)], cpu="9")
    )
    for i in range(50):  # learn a workload of 8-core whole-card pods
        cs.fragmentation.observe([WHOLE._replace(cpu=8000)], uid=f"seen-{i}")
    cs.fragmentation._set_active(cs.fragmentation.histogram.distribution())
    # A CPU-heavy share would leave "tight" unable to feed a whole-card pod: it goes to "rich".
    out = cs.filter(share_pod("heavy", 30, cpu="6"), ["rich", "tight"])
    assert out.node == "rich"
    # The released pod's CPU leaves the node again.
    assert cs.remove_pod("heavy")
    assert cs._nodes["rich"].cpu_used == 0


def test_restart_relearns_from_live_pods():
    cs = frag_state()
    cs.upsert_node(reg_node("a", [Device("a0", 0, 10, 16384, 100, "NVIDIA-T4")]))
    live = []
    for i in range(3):
        p = share_pod(f"l{i}", 20)
        out = cs.filter(p, ["a"])
        p["metadata"]["annotations"].update(out.annotations)
        live.append(p)
    fresh = frag_state()
    before = fresh.fragmentation.histogram.observed
    fresh.rebuild([reg_node("a", [Device("a0", 0, 10, 16384, 100, "NVIDIA-T4")])], live)
    assert fresh.fragmentation.histogram.observed == before + 3
    assert fresh.usage_snapshot() == cs.usage_snapshot()
    assert fresh._nodes["a"].cpu_used == cs._nodes["a"].cpu_used == 3000


def test_refresh_scores_with_the_learned_workload_at_once():
    m = FragmentationModel(WorkloadHistogram({HALF: 1.0}, prior_weight=8), check_every=128)
    for i in range(5):
        m.observe([WHOLE], uid=f"w{i}")
    assert set(m.active) == {HALF}  # five pods: no periodic check yet
    v = m.version
    assert m.refresh() and m.version == v + 1
    # prior 8 on HALF against 5 whole cards weighted 1 each (decay under 0.1 %)
    assert m.active[WHOLE] == pytest.approx(5 / 13, rel=0.01)
    assert not m.refresh() and m.version == v + 1  # nothing moved since


def _live_pod(**kw: Any) -> tuple[dict, Shape]:
    """A pod placed by a filter, as a relist lists it (allocation annotations, Running)."""
    from tests.builders import cards, ctr, node, pod

    first = ClusterState()
    first.upsert_node(node("n", cards("n", 2)))
    p = pod(ctr(gpu=1, mem=3000, cores=30), **kw)
    out = first.filter(p, ["n"])
    assert out.node == "n"
    meta = {**p["metadata"], "annotations": {**p["metadata"]["annotations"], **out.annotations}}
    return {**p, "metadata": meta, "status": {"phase": "Running"}}, Shape(1, 3000, 0, 30)


def test_a_rebuild_relearns_the_workload_from_the_listed_pods():
    from tests.builders import cards, node

    live, shape = _live_pod()
    fresh = frag_state()
    assert shape not in fresh.fragmentation.active  # the prior only
    fresh.rebuild([node("n", cards("n", 2))], [live])
    assert fresh.fragmentation.active[shape] > 0.5  # one live pod outweighs the prior of 8


def test_no_fragmentation_policy_learns_nothing_until_a_pod_asks_for_it(monkeypatch):
    from tests.builders import cards, ctr, node, pod

    live, shape = _live_pod()
    state = ClusterState()  # binpack / spread: nothing reads the learned workload
    assert not state.learning
    parsed: list[str] = []
    monkeypatch.setattr(state, "_learn", lambda p, uid: parsed.append(uid))
    state.rebuild([node("n", cards("n", 2))], [live])
    assert parsed == [] and shape not in state.fragmentation.active
    # A pod of its own fragmentation policy: learning starts there, with that pod.
    asks = pod(ctr(gpu=1, mem=5000, cores=10), annotations={A.NODE_SCHEDULER_POLICY: "fragmentation"})
    assert state.filter(asks, ["n"]).node == "n"
    assert state.learning and state.fragmentation.histogram.observed == 1
    other = pod(ctr(gpu=1, mem=3000, cores=30))
    state.filter(other, ["n"])
    assert state.fragmentation.histogram.observed == 2


def test_a_relist_does_not_parse_the_pods_it_already_counted(monkeypatch):
    from tests.builders import cards, node

    live, _ = _live_pod()
    state = frag_state()
    state.rebuild([node("n", cards("n", 2))], [live])
    assert state.fragmentation.seen(live["metadata"]["uid"])
    calls: list[str] = []
    real = state.pod_requests
    monkeypatch.setattr(state, "pod_requests", lambda p: calls.append(p["metadata"]["uid"]) or real(p))
    state.rebuild([node("n", cards("n", 2))], [live])
    assert calls == []


# ----------------------------------------------------------------------------------------------
# requests in the shapes HAMi users send: memory only, memory and cores, whole cards

MEM6 = Shape(1, 6144, 0, 0)  # nvidia.com/gpumem: 6144, no gpucores (HAMi's default: 0 cores)


def test_a_memory_only_request_counts_the_memory_it_leaves():
    one = [card(0)]  # 16384 MiB, 10 slots
    # The card's memory is all taken (no cores): nothing is free, so nothing is fragmented.
    full = look({"GPU-0": DeviceUsage(2, 16384, 0)})
    assert packed_fragmentation(one, full, {MEM6: 1.0}) == 0
    # An idle card takes two 6144 MiB containers; the 4096 MiB left is a quarter card lost to the shape.
    assert packed_fragmentation(one, look({}), {MEM6: 1.0}) == pytest.approx(0.25)
    # The memoised path says the same.
    model = FragmentationModel(WorkloadHistogram({MEM6: 1.0}, prior_weight=1))
    assert model.node_value(one, full) == 0
    assert model.node_value(one, look({})) == pytest.approx(0.25)


def test_a_card_is_bound_by_the_largest_of_its_cores_memory_and_slots():
    one = [card(0, count=4)]
    share = Shape(1, 0, 25, 25)
    # Four 10 % pods took every slot: the card takes no more pods, its free capacity is none.
    assert packed_fragmentation(one, look({"GPU-0": DeviceUsage(4, 6553, 40)}), {share: 1.0}) == 0
    # Cores 20 % and memory 60 % taken: 0.4 of the card is free; a 50 %-cores, 10 %-memory share fits
    # once and raises the card to 70 % cores: 0.3 is left that the shape cannot use.
    u = look({"GPU-0": DeviceUsage(1, 16384 * 60 // 100, 20)})
    assert packed_fragmentation(one, u, {Shape(1, 0, 10, 50): 1.0}) == pytest.approx(0.3, abs=1e-6)


def test_memory_only_pods_are_placed_where_their_memory_fits_best():
    cs = frag_state()
    for name in ("a", "b"):
        cs.upsert_node(reg_node(name, [Device(f"{name}0", 0, 10, 16384, 100, "NVIDIA-T4")]))

    def mem_pod(uid: str, mib: int) -> dict:
        limits = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": str(mib)}
        return {
            "metadata": {"name": uid, "namespace": "default", "uid": uid, "annotations": {}},
            "spec": {"schedulerName": "hami-scheduler",
                     "containers": [{"name": "c", "resources": {"limits": limits, "requests": {"cpu": "1"}}}]},
        }  # fmt: skip

    assert cs.filter(mem_pod("held", 4096), ["a"]).node == "a"
    model = cs.fragmentation
    model._set_active({Shape(1, 12288, 0, 0, (), 1000): 0.5, Shape(1, 4096, 0, 0, (), 1000): 0.5})
    # A 4096 MiB pod on a's card would leave 8192 MiB there, where no 12288 MiB pod fits: it opens b.
    assert cs.filter(mem_pod("small", 4096), ["a", "b"]).node == "b"
    # So both 12288 MiB pods that follow fit.
    assert {cs.filter(mem_pod(f"big{i}", 12288), ["a", "b"]).node for i in range(2)} == {"a", "b"}


def test_a_memory_only_shape_is_weighted_by_the_card_share_it_takes():
    m = FragmentationModel(WorkloadHistogram({}, prior_weight=0))  # no card registered: a 16 GiB card
    m.observe([Shape(1, 8192, 0, 0)], uid="half")
    m.observe([WHOLE], uid="whole")
    # Half a card's memory weighs 1 / 0.5^2 = 4 against a whole card's 1 (not 1 / 0.01^2 for "no cores").
    assert m.histogram.distribution()[Shape(1, 8192, 0, 0)] == pytest.approx(4 / 5, rel=1e-3)
    # Measured on the fleet's most common card once nodes register: 8192 of 32768 MiB is a quarter.
    m.note_cards([card(i, mib=32768) for i in range(3)] + [card(9)])
    m.observe([Shape(1, 8192, 0, 0)], uid="quarter")
    assert m.histogram.weights[Shape(1, 8192, 0, 0)] == pytest.approx(4 + 16, rel=1e-3)


def test_each_vendor_is_measured_under_its_own_shapes():
    from hami.simulate.fragmeter import FragmentationMeter
    from tests.vendor_fleet import ASCEND_910B3, CONFIG, node

    cs = ClusterState(config=CONFIG)
    cs.upsert_node(reg_node("gpu", [Device("g0", 0, 10, 16384, 100, "NVIDIA-T4")]))
    cs.upsert_node(node("npu", annotations={"hami.io/node-register-Ascend910B3": ASCEND_910B3}))
    model = cs.fragmentation
    model._set_active({HALF._replace(cpu=1000): 1.0})  # NVIDIA half cards only, as learned
    # The idle Ascend chips are not fragments of NVIDIA pods: no Ascend pod was seen, so they are
    # measured under the prior (as memory shares), whose 1- and 2-chip shapes they serve; only its 4-
    # and 8-chip shapes (0.05 and 0.07 of it) cannot run on the 2-chip node, and a 75 % share leaves a
    # quarter of each chip (0.05 of it).
    meter = FragmentationMeter(cs)
    meter.measure()
    free, frag = meter.last["npu"]
    assert free == 2.0 and frag == pytest.approx(2.0 * (0.05 + 0.07) + 0.5 * 0.05)
    assert meter.last["gpu"] == (1.0, 0.0)
    # An Ascend shape learned next to the NVIDIA ones is measured on the Ascend chips only, with its
    # popularity normalised within the vendor: a 3-chip request cannot run on a 2-chip node.
    model._set_active({HALF: 0.9, Shape(3, 0, 100, 100, vendor="Ascend910B3"): 0.1})
    meter.measure()
    assert meter.last["npu"] == (2.0, 2.0)
    assert meter.last["gpu"] == (1.0, 0.0)
