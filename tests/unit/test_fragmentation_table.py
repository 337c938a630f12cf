"""hami.fragmentation_table: the vectorised measure equals the scalar one bit for bit, and the per-node
columns the filter keeps up to date on reservations, releases, CPU changes and workload refreshes
equal a full recomputation."""

from __future__ import annotations

import math
import random
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hami import annotations as A
from hami.cluster import ClusterState
from hami.config import DeviceConfig
from hami.fragmentation import (
    FragmentationModel,
    Shape,
    VendorMeasure,
    WorkloadHistogram,
    packed_fragmentation,
    usage_of,
)
from hami.fragmentation_table import NodeTermTable
from hami.model import Device
from hami.registration import encode_node_devices_json

SHAPES = [
    Shape(1, 0, 50, 50),
    Shape(1, 0, 100, 100),
    Shape(2, 0, 100, 100, (), 16000),
    Shape(1, 0, 25, 25, (), 4000),
    Shape(1, 6000, 0, 30, ("t4",), 2000),
    Shape(4, 0, 100, 100, (), 32000),
    Shape(1, 0, 81, 81, (), 3000),
    Shape(1, 0, 14, 14, (), 1000),
]


def model_of(weights: list[int]) -> FragmentationModel:
    z = sum(weights)
    return FragmentationModel(
        WorkloadHistogram({s: w / z for s, w in zip(SHAPES, weights, strict=True)}, prior_weight=1)
    )


@pytest.mark.parametrize("cpu_weight", [0.0, 1.0, 2.5])
@pytest.mark.parametrize("n", [1, 2, 3, 17, 300])
def test_vectorised_value_is_the_scalar_value_bit_for_bit(n, cpu_weight):
    rng = random.Random(n)
    model = model_of([rng.randint(1, 9) for _ in SHAPES])
    measure = model.of("NVIDIA")
    measure.cpu_weight, measure.cpu_per_card = cpu_weight, 13_700.0  # the CPU term, when weighted
    table = NodeTermTable(model, "NVIDIA")
    free = [rng.randint(0, 800) / 100 for _ in range(n)]
    k = [[rng.randint(0, 40) for _ in SHAPES] for _ in range(n)]
    # the capacity the room would take: none where there is no room, else up to the node's free capacity
    use = [[0.0 if kk == 0 else rng.randint(1, 800) / 100 for kk in row] for row in k]
    cpu = [rng.choice([None, 0, -500, rng.randint(1, 96000)]) for _ in range(n)]
    # gathered from wider columns in a shuffled order, as the filter gathers its candidates' columns
    where = rng.sample(range(2 * n), n)
    wide = np.zeros((len(SHAPES), 2 * n), dtype=np.int32)
    wide[:, where] = np.array(k, dtype=np.int32).T
    wide_use = np.zeros((len(SHAPES), 2 * n))
    wide_use[:, where] = np.array(use).T
    got = table.values(
        np.array(free),
        wide[:, where],
        wide_use[:, where],
        np.array([c or 0 for c in cpu], dtype=np.int64),
        np.array([c is not None for c in cpu]),
    )
    want = [model.value_of(f, kk, uu, c) for f, kk, uu, c in zip(free, k, use, cpu, strict=True)]
    assert got.tolist() == want  # exact: the policy's ties depend on it


def reg_node(name: str, cards: list[Device], cpu: str | None) -> dict:
    node = {"metadata": {"name": name, "annotations": {A.NVIDIA_REGISTER: encode_node_devices_json(cards)}}}
    if cpu is not None:
        node["status"] = {"allocatable": {"cpu": cpu}}
    return node


def gpu_pod(uid: str, shape: Shape) -> dict:
    limits = {"nvidia.com/gpu": str(shape.nums), "nvidia.com/gpucores": str(shape.cores)}
    if shape.mem:
        limits["nvidia.com/gpumem"] = str(shape.mem)
    else:
        limits["nvidia.com/gpumem-percentage"] = str(shape.pct)
    annos = {"nvidia.com/use-gputype": ",".join(shape.types)} if shape.types else {}
    return {
        "metadata": {"name": uid, "namespace": "default", "uid": uid, "annotations": annos},
        "spec": {
            "schedulerName": "hami-scheduler",
            "containers": [
                {"name": "c", "resources": {"limits": limits, "requests": {"cpu": f"{shape.cpu}m"}}}
            ],
        },
    }


def cpu_pod(uid: str, node: str, milli: int) -> dict:
    """A pod without devices that kube-scheduler bound: only its CPU counts on the node."""
    return {
        "metadata": {"name": uid, "namespace": "default", "uid": uid},
        "spec": {
            "schedulerName": "default-scheduler",
            "nodeName": node,
            "containers": [{"name": "c", "resources": {"requests": {"cpu": f"{milli}m"}}}],
        },
    }


def frag_state() -> ClusterState:
    cfg = DeviceConfig()
    sched = replace(cfg.scheduler, nodeSchedulerPolicy="fragmentation", gpuSchedulerPolicy="fragmentation")
    return ClusterState(config=replace(cfg, scheduler=sched))


def scalar_key(model: FragmentationModel, n, shape: Shape) -> float:
    """The node's key recomputed from scratch with a measure that has no memo (the scalar path)."""
    live = model.of("NVIDIA")
    fresh = VendorMeasure(live.dist, cpu_weight=live.cpu_weight, cpu_per_card=live.cpu_per_card)
    devs, look, cpu = n.devices.get("NVIDIA", ()), usage_of(n.usage), n.cpu_free()
    before = fresh.value_of(*fresh.node_terms(devs, look), cpu)
    # the scalar path agrees with the measure's definition
    assert before == pytest.approx(
        packed_fragmentation(devs, look, live.dist, math.inf if cpu is None else cpu,
                             cpu_weight=live.cpu_weight, cpu_per_card=live.cpu_per_card)
    )  # fmt: skip
    move = fresh.gpu_move(devs, look, shape._replace(cpu=0))
    if move is None:
        return math.inf
    return fresh.value_of(*move, None if cpu is None else cpu - shape.cpu) - before


OPS = st.lists(
    st.tuples(st.sampled_from(["pod", "pod", "pod", "release", "cpu", "refresh"]), st.integers(0, 10**6)),
    min_size=1,
    max_size=30,
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(weights=st.lists(st.integers(1, 9), min_size=len(SHAPES), max_size=len(SHAPES)), ops=OPS)
def test_columns_kept_up_to_date_equal_a_full_recomputation(weights, ops):
    cs = frag_state()
    model = cs.fragmentation = model_of(weights)
    # twins (the same cards) share state ids; one node says nothing about its CPU
    t4 = [Device(f"{{}}-{i}", i, 10, 15360, 100, "NVIDIA-T4") for i in range(4)]
    v100 = [Device(f"{{}}-{i}", i, 10, 32768, 100, "NVIDIA-V100M32") for i in range(2)]
    specs = {
        "a": (t4, "32"),
        "b": (t4, "32"),
        "c": (v100, "9"),
        "d": (t4[:2] + v100, None),
        "e": (v100[:1], "4"),
    }
    for name, (cards, cpu) in specs.items():
        cs.upsert_node(reg_node(name, [replace(d, uuid=d.uuid.format(name)) for d in cards], cpu))
    names = sorted(specs)
    live: list[str] = []
    for step, (op, r) in enumerate(ops):
        rng = random.Random(r)
        if op == "pod":
            out = cs.filter(gpu_pod(f"p{step}", rng.choice(SHAPES)), names, explain=False)
            if out.node is not None:
                live.append(f"p{step}")
        elif op == "release" and live:
            assert cs.remove_pod(live.pop(rng.randrange(len(live))))
        elif op == "cpu":
            cs.upsert_pod(cpu_pod(f"c{step}", rng.choice(names), rng.choice([500, 3000, 8000])))
        elif op == "refresh":
            w = [rng.randint(1, 9) for _ in SHAPES]
            model._set_active({s: x / sum(w) for s, x in zip(SHAPES, w, strict=True)})
        # after every change, every shape's keys from the columns equal the recomputed ones
        nodes = [cs._nodes[x] for x in names]
        for s in SHAPES:
            keys = cs._fragmentation_keys(nodes, {"NVIDIA": (s,)}).entries()
            for key, name, n in keys:
                want = scalar_key(model, n, s)
                assert name == n.name
                if math.isinf(want):
                    assert key[0] == want, (name, s)
                else:
                    assert key[0] == pytest.approx(want, rel=1e-12, abs=1e-12), (name, s)
                assert key[1] == -n.current_score()
    table = model.tables["NVIDIA"]
    # a state id is shared by the nodes in that state and released when none is left in it
    live_sids = {int(table._sid[table._slot[x]]) for x in names}
    assert sum(table._refs[i] for i in live_sids) == len(names)
    assert all(table._refs[i] == 0 for i in table._spare)


def test_the_key_order_pops_nodes_as_a_heap_of_every_candidate_would():
    from hami.node_order import _KeyOrder, _Node

    rng = random.Random(5)
    for _ in range(200):
        n = rng.randint(1, 12)
        nodes = [_Node(f"n{rng.randint(0, 99):02d}-{i}") for i in range(n)]
        keys = np.array([rng.choice([0.0, -0.5, 1.25, math.inf]) for _ in range(n)])
        scores = [float(rng.randint(0, 3)) for _ in range(n)]
        entries = [((k, -s), x) for k, s, x in zip(keys.tolist(), scores, nodes, strict=True)]
        want = [x.name for _, x in sorted(entries, key=lambda e: (e[0], e[1].name))]
        order = _KeyOrder(nodes, keys, scores)
        got = []
        while order:
            got.append(order.pop().name)
        assert got == want
