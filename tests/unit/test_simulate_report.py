"""hami.simulate.report and plots: JSON fields, summary table, placements CSV, PNG files."""

from __future__ import annotations

import csv
import json

from hami.config import DeviceConfig
from hami.simulate.engine import Mode, Policy, run
from hami.simulate.plots import write_report
from hami.simulate.report import PLACEMENT_COLUMNS, result_json, results_json, summary_text, write_placements
from hami.simulate.workload import DEFAULT_GPU_MODELS, Workload, gpu_node, openb_pod

CFG = DeviceConfig()


def small_workload() -> Workload:
    nodes = [
        gpu_node("n1", cpu_milli=8000, memory_mib=65536, gpus=1, model="T4", card_mib=15360, config=CFG),
        gpu_node("n2", cpu_milli=8000, memory_mib=65536, gpus=0, model="", card_mib=0, config=CFG),
    ]
    common = {"memory_mib": 1024, "config": CFG, "gpu_models": DEFAULT_GPU_MODELS}
    pods = [
        openb_pod("half", cpu_milli=1000, num_gpu=1, gpu_milli=500, gpu_spec=[], **common),
        openb_pod("cpu", cpu_milli=1000, num_gpu=0, gpu_milli=0, gpu_spec=[], **common),
    ]
    return Workload(nodes, pods, nodes_source="nodes.csv", pods_source="pods.csv")


def fill_run(policy=Policy("binpack", "binpack"), placements=True):
    # Seed 0 draws: half, half, cpu, ... until 1.3 cards arrived.
    return run(
        small_workload(),
        config=CFG,
        policy=policy,
        mode=Mode.FILL,
        arrival=130,
        seed=0,
        placements=placements,
    )


def test_result_json_fields():
    r = fill_run()
    j = result_json(r, small_workload())
    assert j["policy"] == "binpack" and j["node_policy"] == "binpack" and j["card_policy"] == "binpack"
    assert (j["mode"], j["arrival"], j["seed"], j["nodes"], j["gpus"]) == ("fill", 130.0, 0, 2, 1)
    assert (
        j["gpu_pods"] == 3
        and j["scheduled"] == j["pods"] - 1
        and j["failed"] == 1
        and j["failed_gpu_pods"] == 1
    )
    assert (j["gpu_allocation_ratio"], j["memory_allocation_ratio"]) == (1.0, 1.0)
    assert j["first_failure_arrival"] == 150.0
    assert j["failure_reasons"] == {"CardInsufficientMemory": 1}
    # one card: two half shares take half its cores and memory and 2 of its 10 slots each
    whole = {"cards": 1, "capacity_allocation_ratio": 1.0, "gpu_allocation_ratio": 1.0,
             "memory_allocation_ratio": 1.0, "slot_allocation_ratio": 0.2}  # fmt: skip
    assert j["per_model"] == {"T4": whole} and j["per_family"] == {"nvidia": whole}
    assert (j["capacity_allocation_ratio"], j["slot_allocation_ratio"]) == (1.0, 0.2)
    # the failed pod asked for half a card: 50 % of the cluster's one card of capacity
    assert (j["failed_gpu_demand"], j["failed_gpu_demand_pct"]) == (0.5, 50.0)
    assert [c["arrival"] for c in j["allocation_at_arrival"]] == [float(x) for x in range(10, 131, 10)]
    assert j["allocation_at_arrival"][0] == {
        "arrival": 10.0,
        "capacity_allocation_ratio": 0.5,
        "gpu_allocation_ratio": 0.5,
        "memory_allocation_ratio": 0.5,
        "slot_allocation_ratio": 0.1,
    }
    assert j["decision_ms"]["count"] == 3 and j["decision_ms"]["p99"] >= j["decision_ms"]["p50"] > 0
    assert isinstance(j["elapsed_s"], float)
    json.dumps(j)  # serialisable as is


def test_compare_json_is_keyed_by_policy():
    w = small_workload()
    rs = [fill_run(Policy("binpack", "binpack")), fill_run(Policy("spread", "spread"))]
    j = results_json(rs, w, compare=True)
    assert list(j) == ["binpack", "spread"] and j["spread"]["policy"] == "spread"
    assert results_json(rs[:1], w, compare=False)["policy"] == "binpack"


def test_summary_text():
    text = summary_text([fill_run()], small_workload())
    lines = text.splitlines()
    assert (
        lines[0] == "hami simulate - fill mode: pods drawn with seed 0 until arrived GPU demand reached 130%"
    )
    assert lines[1] == "cluster: 2 nodes, 1 GPUs (T4 1) from nodes.csv"
    assert lines[2] == "workload: 2 pods from pods.csv"
    assert lines[4].split() == [
        "policy", "pods", "scheduled", "failed", "GPU", "pods", "failed", "failed", "demand", "capacity",
        "cores", "memory", "slots", "1st", "fail", "at", "p50", "ms", "p99", "ms", "time", "s",
    ]  # fmt: skip
    row = lines[6].split()
    assert row[0] == "binpack" and row[3:10] == ["1", "1", "50.0%", "100.00%", "100.00%", "100.00%", "20.00%"]
    assert row[10] == "150.0%"
    assert (
        "capacity taken at arrived demand (percent of the cards' capacity; arrivals in percent of GPU capacity):"
        in lines
    )
    assert lines[-1] == "  binpack: 1 CardInsufficientMemory"


def test_placements_csv(tmp_path):
    r = fill_run()
    path = tmp_path / "p.csv"
    n = write_placements(path, [r])
    rows = list(csv.DictReader(path.open()))
    assert n == len(rows) == r.pods
    assert tuple(rows[0]) == PLACEMENT_COLUMNS
    gpu = [x for x in rows if x["card_uuid"]]
    assert gpu[0] == {
        "pod": "half",
        "container": "main",
        "node": "n1",
        "card_uuid": "GPU-n1-0",
        "card_model": "NVIDIA-T4",
        "mem_mib": "7680",
        "cores": "50",
        "reason": "",
        "policy": "binpack",
    }
    failed = [x for x in rows if x["reason"]]
    assert len(failed) == 1 and failed[0]["node"] == "" and failed[0]["mem_mib"] == ""
    assert failed[0]["reason"] == "0/2 nodes fit: 1 CardInsufficientMemory; 1 node unregistered"
    cpu = [x for x in rows if x["pod"].startswith("cpu")]
    assert cpu and all(x["node"] in ("n1", "n2") and x["card_uuid"] == "" for x in cpu)


def test_report_writes_pngs(tmp_path):
    paths = write_report(
        [fill_run(placements=False), fill_run(Policy("spread", "spread"), False)], tmp_path / "rep"
    )
    assert [p.name for p in paths] == [
        "gpu_allocation_vs_arrival.png",
        "allocation_by_card_model.png",
        "fragmentation_vs_arrival.png",
        "node_fragmentation.png",
        "failure_reasons.png",
    ]
    for p in paths:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 5000
