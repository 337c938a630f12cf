"""The simulator's fragmentation figures (hami.simulate.fragmeter) and where they are shown: checkpoints,
the per-node table, --json, the --report CSVs and plots, the failure reasons and trace mode's peak reason."""

from __future__ import annotations

import csv
import random

from hami import fragmentation
from hami.cluster import ClusterState
from hami.config import DeviceConfig
from hami.fragmentation import FragmentationModel, Shape, WorkloadHistogram
from hami.model import DeviceUsage
from hami.simulate.engine import Mode, Policy, run
from hami.simulate.fragmeter import FragmentationMeter, NodeFragmentation, top_nodes
from hami.simulate.plots import write_report
from hami.simulate.report import (
    NODE_FRAGMENTATION_COLUMNS,
    input_title,
    result_json,
    summary_text,
    write_tables,
)
from hami.simulate.workload import DEFAULT_GPU_MODELS, Workload, gpu_node, openb_pod

CFG = DeviceConfig()
WHOLE = Shape(1, 0, 100, 100)


def node(name, gpus, model="T4", cpu=8000):
    return gpu_node(
        name,
        cpu_milli=cpu,
        memory_mib=65536,
        gpus=gpus,
        model=model,
        card_mib=DEFAULT_GPU_MODELS[model],
        config=CFG,
    )


def pod(name, milli, num_gpu=1, cpu=1000, created=None, deleted=None):
    return openb_pod(
        name, cpu_milli=cpu, memory_mib=1024, num_gpu=num_gpu, gpu_milli=milli, gpu_spec=[], config=CFG,
        gpu_models=DEFAULT_GPU_MODELS, creation_time=created, deletion_time=deleted,
    )  # fmt: skip


def submit(state, p, uid, names):
    obj = {**p.obj, "metadata": {**p.obj["metadata"], "uid": uid, "name": uid}}
    out = state.filter(obj, names, explain=False)
    assert out.node is not None, out.failed_nodes
    return out.node


def whole_card_state(nodes):
    """A state that measures against one shape only: a whole card (fewer than 128 pods are observed, so
    the scoring distribution stays the given prior)."""
    state = ClusterState(config=CFG)
    state.fragmentation = FragmentationModel(WorkloadHistogram({WHOLE: 1.0}))
    for n in nodes:
        state.upsert_node(n.obj)
    return state


def test_hand_computed_fragmentation_of_a_tiny_cluster():
    # n1: 2 T4, one holds a 50 % share; n2: 1 idle T4. Against whole-card pods the half-used card's free
    # half is lost (0.5 card); the idle cards are not fragmented. So 0.5 of 2.5 free cards.
    nodes = [node("n1", 2), node("n2", 1)]
    state = whole_card_state(nodes)
    assert submit(state, pod("half", 500), "u1", ["n1"]) == "n1"
    meter = FragmentationMeter(state)
    total = meter.measure()
    assert (round(total.free, 6), round(total.fragmented, 6)) == (2.5, 0.5)
    assert total.ratio == 0.2 and total.shapes == 1
    rows = {x.node: x for x in meter.nodes()}
    assert rows["n1"] == NodeFragmentation("n1", "T4", 2, 1.5, 0.5)
    assert rows["n2"] == NodeFragmentation("n2", "T4", 1, 1.0, 0.0)
    assert [x.node for x in top_nodes(meter.nodes())] == ["n1", "n2"]


def test_another_learned_workload_is_measured_afresh():
    # Same state, a model whose version number is the same but whose only shape is a half card: every
    # free share can take one, so nothing is fragmented any more.
    state = whole_card_state([node("n1", 2), node("n2", 1)])
    submit(state, pod("half", 500), "u1", ["n1"])
    meter = FragmentationMeter(state)
    assert round(meter.measure().fragmented, 6) == 0.5
    state.fragmentation = FragmentationModel(WorkloadHistogram({Shape(1, 0, 50, 50): 1.0}))
    assert state.fragmentation.version == 1
    again = meter.measure()
    assert (round(again.free, 6), again.fragmented) == (2.5, 0.0)


def test_cpu_bound_node_counts_its_free_cards_as_fragmented():
    # The whole-card shape asks 6000 millicores; n1 has 8000: after a 3000m pod, no whole-card pod can run
    # there, so its idle card (1.0) and the free half (0.5) are all lost.
    nodes = [node("n1", 2)]
    state = ClusterState(config=CFG)
    state.fragmentation = FragmentationModel(WorkloadHistogram({WHOLE._replace(cpu=6000): 1.0}))
    for n in nodes:
        state.upsert_node(n.obj)
    submit(state, pod("half", 500, cpu=3000), "u1", ["n1"])
    total = FragmentationMeter(state).measure()
    assert (round(total.free, 6), round(total.fragmented, 6)) == (1.5, 1.5)


def reference(state, nodes, cpu_free):
    """Sum over nodes of `node_value` and of the from-scratch `packed_fragmentation`, computed here from
    public views (the nodes' cards, `usage_snapshot`)."""
    snap = state.usage_snapshot()
    model = state.fragmentation
    memo = total = 0.0
    for n in nodes:
        usage = {u: DeviceUsage(*t) for u, t in snap.get(n.name, {}).items()}
        look = fragmentation.usage_of(usage)
        memo += model.node_value(n.cards, look, cpu_free[n.name])
        m = model.of("NVIDIA")
        total += fragmentation.packed_fragmentation(
            n.cards, look, m.dist, cpu_free[n.name], cpu_weight=m.cpu_weight, cpu_per_card=m.cpu_per_card
        )
    return memo, total


def test_cached_measure_equals_a_fresh_computation_after_random_reservations_and_releases():
    rng = random.Random(7)
    nodes = [node(f"n{i}", rng.choice([1, 2, 4])) for i in range(12)]
    state = ClusterState(config=CFG)
    for n in nodes:
        state.upsert_node(n.obj)
    names = [n.name for n in nodes]
    meter = FragmentationMeter(state)
    live: dict[str, tuple[str, int]] = {}
    for step in range(300):
        if live and rng.random() < 0.4:
            uid = rng.choice(sorted(live))
            del live[uid]
            state.remove_pod(uid)
        else:
            p = pod(f"p{step}", rng.choice([100, 250, 500, 1000]), cpu=rng.choice([0, 500, 2000]))
            obj = {**p.obj, "metadata": {**p.obj["metadata"], "uid": f"u{step}", "name": f"p{step}"}}
            out = state.filter(obj, names, explain=False)
            if out.node is not None:
                live[f"u{step}"] = (out.node, p.cpu_milli)
        if step % 10 == 0:
            cpu = {n.name: n.cpu_milli - sum(c for nd, c in live.values() if nd == n.name) for n in nodes}
            got = meter.measure()
            memo, scratch = reference(state, nodes, cpu)
            assert abs(got.fragmented - memo) < 1e-9 and abs(got.fragmented - scratch) < 1e-6
            fresh = FragmentationMeter(state).measure()
            assert (got.free, got.fragmented) == (fresh.free, fresh.fragmented)
            assert state.fragmentation.version == got.version


def small_workload():
    nodes = [node("a", 2), node("b", 1, model="V100M32")]
    pods = [pod("half", 500), pod("whole", 1000), pod("cpu", 0, num_gpu=0)]
    return Workload(nodes, pods, nodes_source="nodes.csv", pods_source="pods.csv")


def fill(policy=Policy("binpack", "binpack"), arrival=130):
    return run(
        small_workload(), config=CFG, policy=policy, mode=Mode.FILL, arrival=arrival, seed=3, placements=True
    )


def test_fill_checkpoints_carry_the_fragmentation_of_the_state_then():
    r = fill()
    assert [c.arrival for c in r.checkpoints] == [float(x) for x in range(10, 131, 10)]
    assert all(c.fragmentation is not None for c in r.checkpoints)
    # The last checkpoint is taken after the last GPU pod, so it is the state at the end of the run.
    w = small_workload()
    cpu = {n.name: n.cpu_milli for n in w.nodes}
    placed = {}
    for p in r.placements:
        if p.node:
            placed.setdefault(p.pod, p.node)
    for nd in placed.values():
        cpu[nd] -= 1000  # every pod of this workload asks 1000 millicores
    memo, scratch = reference(r.state, w.nodes, cpu)
    last = r.checkpoints[-1].fragmentation
    assert abs(last.fragmented - memo) < 1e-9 and abs(last.fragmented - scratch) < 1e-6
    assert r.node_fragmentation_at is None
    assert abs(sum(x.fragmented for x in r.node_fragmentation) - last.fragmented) < 1e-9
    assert abs(sum(x.free for x in r.node_fragmentation) - last.free) < 1e-9
    assert last.free == sum(max(0, s.devcore - s.usedcores) / 100 for s in r.state.card_stats())


def test_node_table_has_the_most_fragmented_node_first_and_json_bounds_it():
    r = fill()
    ranked = top_nodes(r.node_fragmentation)
    assert ranked[0].fragmented == max(x.fragmented for x in r.node_fragmentation)
    assert {x.node for x in r.node_fragmentation} == {"a", "b"}
    j = result_json(r, small_workload())["fragmentation"]
    assert [x["node"] for x in j["nodes"]["top"]] == [x.node for x in ranked]
    assert j["nodes"]["at"] == "end" and j["nodes"]["gpu_nodes"] == 2
    assert j["nodes"]["top"][0]["fragmented_cards"] == round(ranked[0].fragmented, 4)
    assert [x["arrival"] for x in j["over_time"]] == [c.arrival for c in r.checkpoints]
    assert j["over_time"][-1]["fragmented_cards"] == round(r.checkpoints[-1].fragmentation.fragmented, 4)


def test_json_top_nodes_are_bounded():
    nodes = [node(f"n{i:02d}", 1) for i in range(30)]
    w = Workload(nodes, [pod("q", 250)], nodes_source="n", pods_source="p")
    r = run(w, config=CFG, policy=Policy("spread", "spread"), mode=Mode.FILL, arrival=50, seed=0)
    j = result_json(r, w)["fragmentation"]["nodes"]
    assert j["gpu_nodes"] == 30 and len(j["top"]) == 20
    frags = [x["fragmented_cards"] for x in j["top"]]
    assert frags == sorted(frags, reverse=True)


def test_summary_text_shows_fragmentation_over_arrivals_and_the_nodes():
    # At 50 % the T4 node is full and the V100 node idle: a one-card node is all fragment for the
    # multi-card shapes of the workload (the prior's), so it is the node listed first.
    r = fill(arrival=50)
    text = summary_text([r], small_workload())
    lines = text.splitlines()
    k = lines.index(
        "expected fragmentation at arrived demand: free GPU capacity (cards) that no pod of the learned "
        "workload could use:"
    )
    assert lines[k + 1].split()[:3] == ["policy", "10%", "20%"]
    row = lines[k + 3].split()
    assert row[0] == "binpack" and row[-1] == f"{r.checkpoints[-1].fragmentation.fragmented:.1f}"
    k = lines.index("most fragmented nodes, binpack (at the end of the run):")
    first = top_nodes(r.node_fragmentation)[0]
    assert lines[k + 3].split()[:3] == ["b", "V100M32", "1"] and first.node == "b"
    assert lines[k + 3].split()[4] == f"{first.fragmented:.2f}" and len(lines) == k + 4  # "a" has none
    full = summary_text([fill()], small_workload())
    assert "most fragmented nodes, binpack (at the end of the run): none" in full.splitlines()


def test_failure_reasons_csv_and_node_csv(tmp_path):
    rs = [fill(), fill(Policy("spread", "spread"))]
    paths = write_tables(rs, tmp_path)
    assert [p.name for p in paths] == ["node_fragmentation.csv", "failure_reasons.csv"]
    rows = list(csv.DictReader(paths[0].open()))
    assert tuple(rows[0]) == NODE_FRAGMENTATION_COLUMNS and len(rows) == 4
    binpack = [x for x in rows if x["policy"] == "binpack"]
    assert binpack[0]["node"] == top_nodes(rs[0].node_fragmentation)[0].node
    reasons = list(csv.DictReader(paths[1].open()))
    for r in rs:
        got = {x["reason"]: int(x["pods"]) for x in reasons if x["policy"] == r.policy.label}
        assert got == dict(r.failure_reasons) and sum(got.values()) == r.failed > 0


def test_report_files_are_named_for_what_they_show(tmp_path):
    w = small_workload()
    fill_dir = write_report([fill()], tmp_path / "fill", w)
    assert [p.name for p in fill_dir] == [
        "gpu_allocation_vs_arrival.png",
        "allocation_by_card_model.png",
        "fragmentation_vs_arrival.png",
        "node_fragmentation.png",
        "failure_reasons.png",
    ]
    for p in fill_dir:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 5000
    tr = trace_run()
    names = [p.name for p in write_report([tr], tmp_path / "trace", trace_workload())]
    assert names[0] == "gpu_allocation_over_time.png" and names[2] == "fragmentation_over_time.png"


def test_titles_name_the_input(tmp_path):
    nodes_csv, pods_csv = tmp_path / "openb_nodes.csv", tmp_path / "openb_pods.csv"
    nodes_csv.write_text("x")
    pods_csv.write_text("x")
    w = small_workload()
    w = Workload(w.nodes, w.pods, nodes_source=str(nodes_csv), pods_source=str(pods_csv))
    assert input_title([fill()], w) == "openb_pods.csv on openb_nodes.csv, fill to 130 %, seed 3"
    assert input_title([trace_run()], w) == "openb_pods.csv on openb_nodes.csv, trace replay"


def trace_workload():
    nodes = [node("a", 2)]
    pods = [
        pod("p1", 1000, created=0, deleted=100),
        pod("p2", 500, created=10, deleted=50),
        pod("p3", 1000, created=20, deleted=30),  # refused: the cards are taken
    ]
    return Workload(nodes, pods, nodes_source="nodes.csv", pods_source="pods.csv")


def trace_run():
    return run(trace_workload(), config=CFG, policy=Policy("binpack", "binpack"), mode=Mode.TRACE)


def test_trace_node_table_is_taken_at_the_checkpoint_of_highest_allocation_and_json_says_why():
    r = trace_run()
    assert r.failed_gpu_pods == 1 and r.peak_gpu_allocation_ratio == 0.75
    best = max(r.checkpoints, key=lambda c: c.gpu_allocation_ratio)
    assert r.node_fragmentation_at is best and best.gpu_allocation_ratio == 0.75
    (row,) = r.node_fragmentation
    assert (row.node, row.free) == ("a", best.fragmentation.free) and round(row.free, 6) == 0.5
    j = result_json(r, trace_workload())
    assert j["peak_reason"].startswith("peak capacity 75.00% at trace time 10 s; 1 GPU pods were refused")
    assert j["fragmentation"]["nodes"]["at"] == {"arrival": best.arrival, "time": best.time}
    assert j["failure_reasons"] == dict(r.failure_reasons) and sum(j["failure_reasons"].values()) == 1
    text = summary_text([r], trace_workload())
    assert "  binpack: peak capacity 75.00% at trace time 10 s; 1 GPU pods were refused" in text


def test_a_run_with_pods_placed_reports_the_start_once(tmp_path):
    # n0's first card holds a placed pod (75 % of the cores, 12000 of 15360 MiB, 2 CPUs): its free
    # quarter fits few shapes, so n0 is the most fragmented node of the start; n1 is idle.
    import yaml

    from hami import annotations as A
    from hami.model import ContainerDevice
    from hami.simulate import kubeyaml
    from hami.simulate.start import split

    ns = [node("n0", 2), node("n1", 2)]
    uuid = ns[0].cards[0].uuid
    manifest = {
        "kind": "Pod",
        "metadata": {"name": "held", "namespace": "default", "annotations": {
            A.NVIDIA_ALLOCATED: A.encode_pod_devices([[ContainerDevice(uuid, "NVIDIA", 12000, 75)]]),
            A.ASSIGNED_NODE: "n0",
        }},
        "spec": {"schedulerName": CFG.scheduler.schedulerName, "nodeName": "n0", "containers": [{
            "name": "c", "resources": {
                "limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "12000", "nvidia.com/gpucores": "75"},
                "requests": {"cpu": "2", "memory": "1Gi"}}}]},
        "status": {"phase": "Running"},
    }  # fmt: skip
    placed, _ = split(kubeyaml.load_pods("pods.yaml", config=CFG, text=yaml.safe_dump(manifest)), CFG)
    w = Workload(ns, [], nodes_source="nodes.yaml", pods_source="pods.yaml")
    r = run(w, config=CFG, policy=Policy("binpack", "binpack"), mode=Mode.TRACE, placed=placed)
    start = r.start_fragmentation
    assert start is not None and r.state.usage_snapshot()["n0"] == {uuid: (1, 12000, 75)}
    memo, scratch = reference(r.state, ns, {"n0": 6000, "n1": 8000})
    assert abs(start.fragmented - memo) < 1e-9 and abs(start.fragmented - scratch) < 1e-6
    # the held card's memory binds it: 12000 of 15360 MiB taken leaves 0.21875 of a card free
    assert round(start.free, 6) == 3.21875
    ranked = top_nodes(r.start_node_fragmentation)
    assert [x.node for x in ranked] == ["n0", "n1"] and ranked[0].fragmented > ranked[1].fragmented
    j = result_json(r, w)["fragmentation"]["start"]
    assert j["at"] == "start" and [x["node"] for x in j["top"]] == ["n0", "n1"]
    text = summary_text([r, r], w).splitlines()
    heads = [x for x in text if x.startswith("most fragmented nodes at the start")]
    assert len(heads) == 1 and "of 3.2 free cards fragmented" in heads[0]
    assert FragmentationMeter(r.state).measure().fragmented == start.fragmented  # nothing arrived
    rows = list(csv.DictReader(write_tables([r], tmp_path)[0].open()))
    assert [(x["policy"], x["node"]) for x in rows] == [
        ("start", "n0"),
        ("start", "n1"),
        ("binpack", "n0"),
        ("binpack", "n1"),
    ]


def test_a_cordoned_nodes_free_compute_is_all_fragmented():
    # Against whole-card pods an idle T4 is not a fragment; cordoned, no pod can reach it at all.
    nodes = [node("open", 1), node("cordoned", 1)]
    nodes[1].obj.setdefault("spec", {})["unschedulable"] = True
    state = whole_card_state(nodes)
    assert FragmentationMeter(state).measure().fragmented == 0.0
    meter = FragmentationMeter(state, closed=frozenset({"cordoned"}))
    total = meter.measure()
    assert (total.free, total.fragmented) == (2.0, 1.0)
    assert meter.last == {"open": (1.0, 0.0), "cordoned": (1.0, 1.0)}
    # the replay passes the cordoned nodes: the half-card pods fill "open" only, "cordoned" stays idle
    r = run(Workload(nodes, [pod("half", 500)]), config=CFG, policy=Policy("binpack", "binpack"), arrival=100)
    rows = {x.node: (x.free, x.fragmented) for x in r.node_fragmentation}
    assert rows["cordoned"] == (1.0, 1.0)
