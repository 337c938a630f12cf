"""`hami simulate` end to end: the console command, its outputs, and its one-line errors (exit status 2).

Tests on the real Alibaba trace run only when ../shared/data/alibaba-gpu-v2023 is present, and replay a
small arrival so they stay fast.
"""

from __future__ import annotations

import csv
import io
import json
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

from hami.cli import build_parser, main
from hami.simulate.command import run_simulate
from tests.ci import SHARED, needs_shared

ROOT = Path(__file__).resolve().parents[2]
TRACE = SHARED / "data" / "alibaba-gpu-v2023"
NODES_CSV = TRACE / "openb_node_list_gpu_node.csv"
SMALL = ["--generate", "16,200", "--no-progress"]


def hami(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hami.cli", *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT
    )


def test_default_run_prints_the_summary():
    p = hami("simulate", "--no-progress")
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert (
        lines[0] == "hami simulate - fill mode: pods drawn with seed 0 until arrived GPU demand reached 130%"
    )
    assert lines[1].startswith("cluster: 200 nodes, ")
    assert lines[2] == "workload: 3000 pods from built-in generator (seed 0, 3000 pods)"
    assert lines[6].split()[0] == "binpack/spread"
    assert p.stderr == ""  # no progress bar when stderr is not a terminal


def test_json_has_the_documented_fields():
    p = hami("simulate", *SMALL, "--policy", "spread", "--json")
    assert p.returncode == 0, p.stderr
    j = json.loads(p.stdout)
    for key in (
        "policy", "mode", "nodes", "gpus", "pods", "scheduled", "failed", "gpu_allocation_ratio",
        "memory_allocation_ratio", "first_failure_arrival", "elapsed_s", "allocation_at_arrival",
    ):  # fmt: skip
        assert key in j, key
    assert (j["policy"], j["node_policy"], j["card_policy"], j["mode"], j["nodes"]) == (
        "spread",
        "spread",
        "spread",
        "fill",
        16,
    )
    assert j["scheduled"] + j["failed"] == j["pods"]
    assert [c["arrival"] for c in j["allocation_at_arrival"]][-1] == 130.0


def test_compare_json_placements_and_report(tmp_path):
    out = tmp_path / "p.csv"
    rep = tmp_path / "rep"
    p = hami(
        "simulate", *SMALL, "--compare", "binpack,spread,binpack/numa+binpack", "--json",
        "--placements", str(out), "--report", str(rep),
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    j = json.loads(p.stdout)
    assert list(j) == ["binpack", "spread", "binpack/numa+binpack"]
    assert j["binpack/numa+binpack"]["card_policy"] == "numa,binpack"
    assert len({j[k]["pods"] for k in j}) == 1  # same stream for every policy
    rows = list(csv.DictReader(out.open()))
    assert {r["policy"] for r in rows} == set(j)
    assert sum(1 for r in rows if r["policy"] == "spread" and r["reason"]) == j["spread"]["failed"]
    assert sorted(x.name for x in rep.iterdir()) == [
        "allocation_by_card_model.png",
        "failure_reasons.csv",
        "failure_reasons.png",
        "fragmentation_vs_arrival.png",
        "gpu_allocation_vs_arrival.png",
        "node_fragmentation.csv",
        "node_fragmentation.png",
        "summary.json",
    ]
    assert json.loads((rep / "summary.json").read_text()) == j


def test_node_and_card_policy_flags():
    args = build_parser().parse_args(
        ["simulate", *SMALL, "--node-policy", "spread", "--card-policy", "numa,binpack"]
    )
    out = io.StringIO()
    args.json = True
    assert run_simulate(args, stdout=out, stderr=io.StringIO()) == 0
    j = json.loads(out.getvalue())
    assert (j["policy"], j["node_policy"], j["card_policy"]) == (
        "spread/numa+binpack",
        "spread",
        "numa,binpack",
    )


class FakeTTY(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_bar_only_on_a_terminal():
    args = build_parser().parse_args(["simulate", "--generate", "16,200", "--policy", "binpack"])
    err = FakeTTY()
    assert run_simulate(args, stdout=io.StringIO(), stderr=err) == 0
    assert "\rbinpack            [" in err.getvalue() and "100.0%" in err.getvalue()


def test_yaml_input(tmp_path):
    nodes = tmp_path / "nodes.yaml"
    nodes.write_text(
        "kind: Node\nmetadata:\n  name: g1\n  annotations:\n    hami.io/node-nvidia-register: "
        '\'[{"id":"GPU-1","count":4,"devmem":16384,"devcore":100,"type":"NVIDIA-T4","health":true}]\'\n'
        "status: {allocatable: {cpu: '8', memory: 32Gi}}\n"
    )
    pods = tmp_path / "pods.yaml"
    pods.write_text(
        "kind: Pod\nmetadata: {name: a, creationTimestamp: '2024-01-01T00:00:00Z'}\n"
        "spec: {containers: [{name: c, resources: {limits: {nvidia.com/gpu: 1, nvidia.com/gpumem: 4096, "
        "nvidia.com/gpucores: 25}}}]}\n"
    )
    out = tmp_path / "p.csv"
    annos = tmp_path / "a.jsonl"
    p = hami(
        "simulate",
        "--annotations",
        str(annos),
        "--nodes",
        str(nodes),
        "--pods",
        str(pods),
        "--mode",
        "trace",
        "--json",
        "--placements",
        str(out),
    )
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["scheduled"] == 1
    assert [json.loads(x) for x in annos.read_text().splitlines()] == [
        {
            "policy": "binpack/spread",
            "pod": "a",
            "annotations": {
                "hami.io/vgpu-node": "g1",
                "hami.io/vgpu-time": "0",
                "hami.io/vgpu-devices-to-allocate": "GPU-1,NVIDIA,4096,25:;",
                "hami.io/vgpu-devices-allocated": "GPU-1,NVIDIA,4096,25:;",
            },
        }
    ]
    assert list(csv.reader(out.open()))[1] == [
        "a",
        "c",
        "g1",
        "GPU-1",
        "NVIDIA-T4",
        "4096",
        "25",
        "",
        "binpack/spread",
    ]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        pytest.param(args, message, id=" ".join(args))
        for args, message in (
            (
                ["--policy", "fastest"],
                "hami: error: --policy: 'fastest' is not a policy; valid: binpack, spread, numa",
            ),
            (["--policy", ""], "hami: error: --policy: empty value; e.g. --policy binpack\n"),
            (
                ["--node-policy", "numa"],
                "hami: error: --node-policy: 'numa' is not a node policy; valid: binpack, spread, fragmentation\n",
            ),
            (
                ["--card-policy", "fast"],
                "hami: error: --card-policy: 'fast' is not a card policy; valid: binpack, spread, numa, mutex, "
                "topology-aware, fragmentation or a comma chain of them such as numa,binpack\n",
            ),
            (["--compare", "binpack,fast"], "hami: error: --compare: 'fast' is not a policy; valid:"),
            (
                ["--compare", "binpack", "--policy", "spread"],
                "hami: error: --compare: give the policies in the list, not also --policy\n",
            ),
            *(
                (
                    ["--arrival", bad],
                    f"hami: error: --arrival: {shown} is not a valid fill target; valid: a percent of the "
                    "cluster's GPU capacity above 0 and at most 1000 (e.g. 130)\n",
                )
                # inf never ended; 1e9 would run for days.
                for bad, shown in (("0", "0"), ("-5", "-5"), ("nan", "nan"), ("inf", "inf"), ("1e9", "1e+09"))
            ),
            (
                ["--mode", "trace", "--arrival", "50"],
                "hami: error: --arrival: only for --mode fill; a trace replays every arrival and deletion at "
                "its own time\n",
            ),
            (
                ["--generate", "1000000,5"],
                "hami: error: --generate: '1000000,5' must be NODES,PODS with NODES",
            ),
            (["--nodes", ""], "hami: error: --nodes: empty file name\n"),
            (["--mode", "replay"], "hami simulate: argument --mode: invalid choice: 'replay'"),
            (["--seed", "x"], "hami simulate: argument --seed: invalid int value: 'x'"),
            (
                ["--nodes", "/nonexistent/n.csv"],
                "hami: error: /nonexistent/n.csv: cannot read: No such file or directory",
            ),
            (["--gpu-models", "T4"], "hami: error: --gpu-models: 'T4' must be MODEL=MiB"),
            (["--generate", "0,5"], "hami: error: --generate: '0,5' must be NODES,PODS"),
            (
                ["--placements", "/nonexistent/dir/p.csv"],
                "hami: error: --placements: directory /nonexistent/dir does not exist",
            ),
        )
    ],
)
def test_errors_are_one_line_and_exit_2(args, message, capsys):
    assert main(["simulate", "--no-progress", *args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(message), err
    assert "Traceback" not in err


def test_malformed_row_error_from_the_console_script(tmp_path):
    bad = tmp_path / "pods.csv"
    bad.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli\na,1000,1000,1,500\nb,1000,lots,1,500\n")
    p = hami("simulate", "--pods", str(bad), "--generate", "4,10")
    assert p.returncode == 2
    assert p.stderr == f"hami: error: {bad}:3: column 3 (memory_mib): 'lots' is not an integer\n"
    assert p.stdout == ""
    p = hami("simulate", "--pods", str(bad.parent / "pods2.csv"), "--mode", "trace", "--generate", "4,10")
    assert p.returncode == 2 and p.stderr.count("\n") == 1


def test_trace_mode_without_times_is_an_error(tmp_path):
    pods = tmp_path / "pods.csv"
    pods.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli\na,1000,1000,1,500\n")
    p = hami("simulate", "--pods", str(pods), "--mode", "trace", "--generate", "4,10")
    assert p.returncode == 2
    assert p.stderr == (
        f"hami: error: {pods}: --mode trace needs a creation time for every pod; 1 of 1 pods have none "
        "(first: a); use --mode fill for pod lists without times\n"
    )


def test_output_paths_are_checked_before_the_replay(tmp_path, capsys):
    # Before, a directory given as --placements or a file given as --report failed only after the
    # whole replay, with "pods.csv: File exists".
    a_file = tmp_path / "f.txt"
    a_file.write_text("x")
    cases = [
        (
            ["--placements", str(tmp_path)],
            f"--placements: '{tmp_path}' is a directory; give a file name such as out/placements.csv",
        ),
        (
            ["--annotations", str(tmp_path)],
            f"--annotations: '{tmp_path}' is a directory; give a file name such as out/annotations.jsonl",
        ),
        (["--report", str(a_file)], f"--report: '{a_file}' is a file; give a directory (created if missing)"),
        (
            ["--report", str(a_file / "sub")],
            f"--report: cannot create directory {a_file / 'sub'}: Not a directory",
        ),
    ]
    for args, message in cases:
        assert main(["simulate", *SMALL, *args]) == 2
        out = capsys.readouterr()
        assert (out.out, out.err) == ("", f"hami: error: {message}\n")


def test_inputs_that_cannot_be_replayed_name_their_file(tmp_path, capsys):
    nodes = tmp_path / "n.csv"
    nodes.write_text("sn,cpu_milli,memory_mib,gpu,model\ncpu,1000,1000,0,\n")
    assert main(["simulate", "--no-progress", "--nodes", str(nodes)]) == 2
    assert capsys.readouterr().err == (
        f"hami: error: {nodes}: the cluster has no GPU: no node has a card (openb: the gpu column; "
        "YAML: the hami.io/node-nvidia-register annotation)\n"
    )
    # A registration without "devcore" decodes as 0 cores; the capacity was 0 and the replay divided by it.
    coreless = tmp_path / "n.yaml"
    coreless.write_text(
        "kind: Node\nmetadata:\n  name: a\n  annotations:\n    hami.io/node-nvidia-register: "
        '\'[{"id":"GPU-0","count":10,"devmem":15360,"type":"NVIDIA-T4","health":true}]\'\n'
    )
    assert main(["simulate", "--no-progress", "--nodes", str(coreless), "--mode", "trace"]) == 2
    assert capsys.readouterr().err == (
        f"hami: error: {coreless}: every card registers devcore 0, so the cluster's GPU capacity (counted "
        "in cores) is 0\n"
    )
    pods = tmp_path / "p.csv"
    pods.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli\na,1000,1000,0,0\n")
    assert main(["simulate", *SMALL, "--pods", str(pods)]) == 2
    assert capsys.readouterr().err == (
        f"hami: error: {pods}: fill mode needs at least one GPU pod; every pod is CPU-only\n"
    )


def test_no_subcommand_prints_help_and_exits_2(capsys):
    assert main([]) == 2
    assert "simulate" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------------
# The real trace (skipped when ../shared/data is absent)

needs_trace = needs_shared(NODES_CSV)


OPENB_MIB = {
    "P100": 16384,
    "T4": 15360,
    "V100M16": 16384,
    "V100M32": 32768,
    "A10": 24576,
    "G2": 32768,
    "G3": 81920,
}


def check_openb_placements(placements: Path, pods_csv: Path) -> dict[str, int]:
    """Issue 2's Done-when on a placements file of a fill run: no card over its memory, cores or split
    count; no pod on a model outside its gpu_spec; distinct cards for every multi-card container;
    every card grant as the openb mapping says. Returns counts for the caller to check coverage."""
    rows = {}
    with pods_csv.open() as f:
        for row in csv.DictReader(f):
            rows[row["name"]] = row
    used = defaultdict(lambda: [0, 0, 0])
    per_container = defaultdict(list)
    constrained = 0
    for r in csv.DictReader(placements.open()):
        if not r["card_uuid"]:
            continue
        model = r["card_model"].removeprefix("NVIDIA-")
        u = used[(r["card_uuid"], model)]
        u[0] += 1
        u[1] += int(r["mem_mib"])
        u[2] += int(r["cores"])
        per_container[(r["policy"], r["pod"], r["container"])].append(r["card_uuid"])
        src = rows["-".join(r["pod"].split("-")[:3])]  # openb-pod-0001-2 is the 2nd draw of openb-pod-0001
        allowed = [m for m in (src.get("gpu_spec") or "").split("|") if m]
        if allowed:
            constrained += 1
            assert model in allowed, r
        milli = int(src["gpu_milli"])
        share = 100 if milli == 1000 else -(-milli // 10)
        assert (int(r["cores"]), int(r["mem_mib"])) == (share, OPENB_MIB[model] * share // 100), r
        assert len(per_container[(r["policy"], r["pod"], r["container"])]) <= int(src["num_gpu"])
    for (_, model), (slots, mem, cores) in used.items():
        assert slots <= 10 and mem <= OPENB_MIB[model] and cores <= 100
    assert all(len(v) == len(set(v)) for v in per_container.values())
    return {
        "cards": len(used),
        "full_cards": sum(1 for u in used.values() if u[2] == 100),
        "multi_card_containers": sum(1 for v in per_container.values() if len(v) > 1),
        "constrained": constrained,
    }


@needs_trace
def test_openb_trace_placements_respect_every_card_limit(tmp_path):
    out = tmp_path / "p.csv"
    pods = TRACE / "openb_pod_list_gpuspec20.csv"
    p = hami(
        "simulate", "--nodes", str(NODES_CSV), "--pods", str(pods), "--mode", "fill", "--arrival", "8",
        "--policy", "binpack", "--json", "--placements", str(out),
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    j = json.loads(p.stdout)
    assert (j["nodes"], j["gpus"]) == (1213, 6212)
    seen = check_openb_placements(out, pods)
    assert seen["constrained"] > 0 and seen["multi_card_containers"] > 0 and seen["full_cards"] > 0


@needs_trace
def test_issue_done_when_command_at_130_percent(tmp_path, capsys):
    # The exact command of issue 2's "Done when" (about 5 s): the cluster is full at the end, so every
    # limit is under pressure.
    out = tmp_path / "p.csv"
    pods = TRACE / "openb_pod_list_default.csv"
    argv = ["simulate", "--nodes", str(NODES_CSV), "--pods", str(pods), "--mode", "fill", "--arrival", "130"]
    assert main([*argv, "--policy", "binpack", "--json", "--placements", str(out)]) == 0
    j = json.loads(capsys.readouterr().out)
    assert (j["nodes"], j["gpus"], j["pods"], j["mode"], j["policy"]) == (
        1213,
        6212,
        10612,
        "fill",
        "binpack",
    )
    assert j["scheduled"] + j["failed"] == j["pods"] and j["failed_gpu_pods"] > 0
    assert [c["arrival"] for c in j["allocation_at_arrival"]] == [10.0 * k for k in range(1, 14)]
    assert 0.8 < j["gpu_allocation_ratio"] <= 1 and j["first_failure_arrival"] is not None
    seen = check_openb_placements(out, pods)
    assert seen["full_cards"] > 4000 and seen["multi_card_containers"] > 0


def test_device_config_sets_default_policies_and_split_count(tmp_path, capsys):
    cfg = tmp_path / "device-config.yaml"
    cfg.write_text(
        "nvidia:\n  deviceSplitCount: 2\nscheduler:\n  nodeSchedulerPolicy: spread\n  gpuSchedulerPolicy: binpack\n"
    )
    assert main(["simulate", *SMALL, "--config", str(cfg), "--json"]) == 0
    j = json.loads(capsys.readouterr().out)
    assert (j["policy"], j["node_policy"], j["card_policy"]) == ("spread/binpack", "spread", "binpack")
    cfg.write_text("nvidia:\n  deviceSplitCount: 0\n")
    assert main(["simulate", *SMALL, "--config", str(cfg)]) == 2
    assert (
        capsys.readouterr().err
        == f"hami: error: --config {cfg}: nvidia.deviceSplitCount: 0 is invalid; valid: an integer >= 1\n"
    )
    # A YAML syntax error is one line too, with the line (PyYAML's own message spans five).
    cfg.write_text("nvidia: [1\n")
    assert main(["simulate", *SMALL, "--config", str(cfg)]) == 2
    assert capsys.readouterr().err == (
        f"hami: error: --config {cfg}:2: invalid YAML: expected ',' or ']', but got '<stream end>'\n"
    )


def test_input_format_is_chosen_by_suffix_else_by_the_first_non_blank_line(tmp_path):
    from hami.simulate.inputs import is_yaml

    cases = {
        "a.csv": "kind: Pod\n",  # the suffix wins
        "b.yml": "name,cpu_milli\n",
        "c": "\n\n  \nkind: Pod\n",  # was read as a CSV whose header is the blank first line
        "d": "\ufeff---\nkind: Pod\n",
        "e": '[{"kind": "Pod"}]\n',
        "f": "name,cpu_milli,memory_mib,num_gpu,gpu_milli\n",
    }
    for name, text in cases.items():
        (tmp_path / name).write_text(text, encoding="utf-8")
    assert {n: is_yaml(str(tmp_path / n)) for n in cases} == {
        "a.csv": False,
        "b.yml": True,
        "c": True,
        "d": True,
        "e": True,
        "f": False,
    }


def test_placements_are_written_in_full_when_stdout_is_closed_early(tmp_path):
    out = tmp_path / "p.csv"
    p = subprocess.run(
        f"{sys.executable} -m hami.cli simulate {' '.join(SMALL)} --placements {out} | head -1",
        shell=True, capture_output=True, text=True, timeout=120, cwd=ROOT,
    )  # fmt: skip
    assert p.returncode == 0 and p.stdout.startswith("hami simulate - fill mode"), p.stderr
    full = subprocess.run(
        [sys.executable, "-m", "hami.cli", "simulate", *SMALL, "--placements", str(tmp_path / "q.csv")],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )  # fmt: skip
    rows = out.read_text().splitlines()
    assert len(rows) > 100 and rows == (tmp_path / "q.csv").read_text().splitlines()
    assert f"placements: {len(rows) - 1} rows written" in full.stdout


def test_progress_lines_without_a_terminal():
    p = hami("simulate", "--generate", "16,200", "--progress", "--compare", "binpack,fragmentation")
    assert p.returncode == 0, p.stderr
    lines = p.stderr.splitlines()
    for label in ("binpack", "fragmentation"):
        mine = [x for x in lines if x.startswith(f"{label}: ")]
        assert mine and mine[-1].startswith(f"{label}: 100 % ("), lines
    assert hami("simulate", "--progress", "--no-progress").stderr.endswith(
        "--progress: not together with --no-progress\n"
    )


def test_summary_explains_its_columns_and_the_trace_peak():
    p = hami("simulate", *SMALL)
    assert p.returncode == 0, p.stderr
    assert (
        "  1st fail at: arrived GPU demand (percent of GPU capacity) when the first GPU pod failed"
        in p.stdout
    )
    assert "cores / memory / slots: card cores / card memory / sharer slots held" in p.stdout
    assert (
        "capacity: the cards' capacity taken, per card the largest of its used cores, memory and slots"
        in p.stdout
    )
    assert "failed demand: the GPU demand of the refused pods" in p.stdout
    t = hami("simulate", *SMALL, "--mode", "trace")
    assert t.returncode == 0, t.stderr
    peak = [x for x in t.stdout.splitlines() if x.startswith("  binpack/spread: peak ")]
    assert len(peak) == 1 and "% at trace time " in peak[0], t.stdout
    assert ("GPU pods were refused" in peak[0]) or ("no GPU pod was refused" in peak[0])


def test_a_node_with_an_unreadable_registration_is_left_out_with_a_warning(tmp_path):
    good = (
        "kind: Node\nmetadata:\n  name: g1\n  annotations:\n    hami.io/node-nvidia-register: "
        '\'[{"id":"GPU-1","count":4,"devmem":16384,"devcore":100,"type":"NVIDIA-T4","health":true}]\'\n'
        "status: {allocatable: {cpu: '8', memory: 32Gi}}\n"
    )
    bad = (
        "kind: Node\nmetadata:\n  name: broken\n  annotations:\n    hami.io/node-nvidia-register: '{not json'\n"
        "status: {allocatable: {cpu: '8', memory: 32Gi}}\n"
    )
    nodes = tmp_path / "nodes.yaml"
    nodes.write_text(good + "---\n" + bad)
    p = hami("simulate", "--nodes", str(nodes), "--json", "--no-progress")
    assert p.returncode == 0, p.stderr
    assert p.stderr.startswith(
        "hami simulate: warning: Node broken: annotation hami.io/node-nvidia-register: not valid JSON"
    )
    assert p.stderr.splitlines()[0].endswith("its NVIDIA cards are left out")
    run = json.loads(p.stdout)
    assert (run["nodes"], run["gpus"]) == (2, 1)  # the node stays, without its cards


def test_restate_replays_the_generated_workload_as_hami_requests(tmp_path):
    p = hami("simulate", *SMALL, "--restate", "gpumem", "--json", "--compare", "binpack,fragmentation")
    assert p.returncode == 0, p.stderr
    j = json.loads(p.stdout)
    assert j["binpack"]["pods_source"] == "built-in generator (seed 0, 200 pods) restated as gpumem (seed 0)"
    # memory-only shares and whole cards take no cores; the capacity they take is counted
    for r in j.values():
        assert r["gpu_allocation_ratio"] == 0 and r["capacity_allocation_ratio"] > 0.5
    yaml_pods = tmp_path / "pods.yaml"
    yaml_pods.write_text("apiVersion: v1\nkind: Pod\nmetadata: {name: a}\nspec: {containers: [{name: c}]}\n")
    bad = hami("simulate", *SMALL, "--pods", str(yaml_pods), "--restate", "hami")
    assert bad.returncode == 2 and "--restate: " in bad.stderr and "Kubernetes YAML" in bad.stderr
    bad = hami("simulate", *SMALL, "--restate", "cores")
    assert bad.returncode == 2 and "--restate: 'cores' is not a variant; valid: hami, gpumem" in bad.stderr
