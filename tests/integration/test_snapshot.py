"""`hami snapshot` and `hami simulate --from-cluster` against the in-memory API server seeded with the demo
cluster (kubefakes.demo_cluster): the saved YAML loads back through the simulator's loaders to the
registered cards and the pods' allocations (checked against the objects' annotations), the live replay is
the replay of the saved files, and errors are one line with a non-zero exit status."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any

import pytest
import yaml

from hami import annotations as A
from hami import cli
from hami.config import load_config_file
from hami.registration import decode_node_devices_json
from hami.simulate import kubeyaml
from hami.tools import command
from kubefakes.apiserver import FakeApiServer, write_kubeconfig
from kubefakes.demo_cluster import DEMO_NOW, demo_objects

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def demo(fake_apiserver: FakeApiServer) -> FakeApiServer:
    for obj in demo_objects(DEMO_NOW):
        fake_apiserver.store.create_any(obj)
    return fake_apiserver


def _by_kind(kind: str) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in demo_objects(DEMO_NOW) if o["kind"] == kind}


def _json(*argv: str) -> tuple[int, dict[str, Any]]:
    out = io.StringIO()
    with redirect_stdout(out):
        code = cli.main(list(argv))
    return code, json.loads(out.getvalue()) if code == 0 else {}


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "HAMI_DEBUG"}
    return subprocess.run([sys.executable, "-m", "hami.cli", *argv], capture_output=True, text=True,
                          timeout=120, cwd=ROOT, env=env)  # fmt: skip


def _one_line_error(r: subprocess.CompletedProcess[str], starts: str) -> None:
    assert r.returncode != 0, r
    assert r.stdout == ""
    assert "Traceback" not in r.stderr and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith(starts), r.stderr


def test_snapshot_loads_back_to_the_registered_cards_and_the_allocations(
    demo: FakeApiServer, kubeconfig: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "snap"
    before = demo.store.resource_version
    assert cli.main(["snapshot", "--out", str(out), "--kubeconfig", kubeconfig]) == 0
    assert demo.store.resource_version == before  # read-only: no write reached the API server
    nodes_want, pods_want = _by_kind("Node"), _by_kind("Pod")
    assert capsys.readouterr().out == (
        f"snapshot: {len(nodes_want)} nodes to {out / 'nodes.yaml'}, {len(pods_want)} pods to {out / 'pods.yaml'}\n"
    )
    config = load_config_file(None)
    nodes = {n.name: n for n in kubeyaml.load_nodes(out / "nodes.yaml", config=config)}
    assert set(nodes) == set(nodes_want) == {
        "gpu-a100-1", "gpu-a100-2", "gpu-v100-1", "gpu-v100-2", "gpu-t4-1", "gpu-t4-2", "cpu-1"
    }  # fmt: skip
    for name, want in nodes_want.items():
        reg = want["metadata"]["annotations"].get(A.NVIDIA_REGISTER)
        cards = decode_node_devices_json(reg) if reg else []
        got = nodes[name].cards
        assert [(d.uuid, d.devmem, d.count, d.type, d.numa) for d in got] == [
            (d.uuid, d.devmem, d.count, d.type, d.numa) for d in cards
        ], name
        # 64 CPUs and 256Gi as allocatable: millicores and MiB.
        assert (nodes[name].cpu_milli, nodes[name].memory_mib, nodes[name].max_pods) == (64000, 262144, 110)
        # Annotations (lock, cordon, handshake) and labels are kept as they are.
        assert nodes[name].obj["metadata"].get("annotations", {}) == want["metadata"]["annotations"]
        assert nodes[name].obj["metadata"]["labels"] == {"kubernetes.io/hostname": name}
    assert len(nodes["gpu-a100-1"].cards) == 4 and nodes["gpu-a100-1"].cards[0].devmem == 81920
    assert nodes["gpu-t4-1"].cards[0].count == 4 and nodes["cpu-1"].cards == ()
    assert nodes["gpu-v100-2"].obj["spec"] == {"unschedulable": True}
    assert "addresses" not in nodes["gpu-a100-1"].obj["status"]  # cut down to what the simulator reads

    pods = {p.name: p for p in kubeyaml.load_pods(out / "pods.yaml", config=config)}
    assert set(pods) == set(pods_want)
    placed = 0
    for name, want in pods_want.items():
        got = pods[name].obj
        annos = want["metadata"]["annotations"]
        assert got["metadata"].get("annotations", {}) == annos
        assert got["metadata"]["namespace"] == want["metadata"]["namespace"]
        assert got["spec"].get("nodeName") == want["spec"].get("nodeName")
        assert got["status"]["phase"] == want["status"]["phase"]
        assert "image" not in got["spec"]["containers"][0]
        if A.NVIDIA_ALLOCATED in annos:
            placed += 1
            node = nodes[annos[A.ASSIGNED_NODE]]
            uuids = {d.uuid for d in node.cards}
            for per in A.decode_pod_devices(got["metadata"]["annotations"][A.NVIDIA_ALLOCATED]):
                assert per and {d.uuid for d in per} <= uuids, name
    assert placed == 14  # every pod the demo placed, the finished one included
    llm = A.decode_pod_devices(pods["llm-0"].obj["metadata"]["annotations"][A.NVIDIA_ALLOCATED])
    assert [(d.uuid, d.usedmem, d.usedcores) for d in llm[0]] == [
        ("GPU-a100-1-0", 40000, 50), ("GPU-a100-1-1", 40000, 50)
    ]  # fmt: skip
    # Requests as the container gave them: 2 cards of 40000 MiB, 50 % cores -> 1 GPU of demand.
    assert pods["llm-0"].gpu_demand == pytest.approx(1.0)
    assert pods["resnet-old"].obj["status"]["phase"] == "Succeeded"
    # The files are plain `kind: List` documents.
    assert yaml.safe_load((out / "nodes.yaml").read_text())["kind"] == "List"


def test_from_cluster_is_the_replay_of_the_snapshot(
    demo: FakeApiServer, kubeconfig: str, tmp_path: Path
) -> None:
    assert cli.main(["snapshot", "--out", str(tmp_path), "--kubeconfig", kubeconfig]) == 0
    before = demo.store.resource_version
    code, live = _json("simulate", "--from-cluster", "--kubeconfig", kubeconfig, "--json", "--seed", "2")
    assert code == 0 and demo.store.resource_version == before
    assert (live["nodes"], live["gpus"], live["pods"] > 0) == (7, 18, True)
    assert live["nodes_source"] == "cluster" and live["pods_source"] == "cluster pods (resampled, seed 2)"
    assert 0 < live["gpu_allocation_ratio"] <= 1 and live["scheduled"] > 0
    code, saved = _json("simulate", "--nodes", str(tmp_path / "nodes.yaml"), "--pods",
                        str(tmp_path / "pods.yaml"), "--json", "--seed", "2")  # fmt: skip
    assert code == 0
    for key in ("gpus", "pods", "scheduled", "failed", "gpu_allocation_ratio", "memory_allocation_ratio",
                "failure_reasons", "allocation_at_arrival"):  # fmt: skip
        assert live[key] == saved[key], key
    # Another seed resamples the cluster's pods differently.
    _, other = _json("simulate", "--from-cluster", "--kubeconfig", kubeconfig, "--json", "--seed", "3")
    assert other["allocation_at_arrival"] != live["allocation_at_arrival"]


def test_from_cluster_with_a_given_workload_and_a_summary(
    demo: FakeApiServer, kubeconfig: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pods = tmp_path / "pods.yaml"
    pods.write_text(yaml.safe_dump({"kind": "Pod", "metadata": {"name": "half"}, "spec": {"containers": [
        {"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "8000",
                                               "nvidia.com/gpucores": "50"}}}]}}))  # fmt: skip
    code, res = _json("simulate", "--from-cluster", "--kubeconfig", kubeconfig, "--pods", str(pods), "--json")
    assert code == 0 and res["pods_source"] == str(pods) and res["nodes_source"] == "cluster"
    assert res["failure_reasons"] == {} or res["failed"] < res["pods"]
    assert (
        cli.main(["simulate", "--from-cluster", "--kubeconfig", kubeconfig, "--compare", "binpack,spread"])
        == 0
    )
    text = capsys.readouterr().out
    assert "cluster: 7 nodes, 18 GPUs" in text and "from cluster" in text
    assert "\nbinpack " in text and "\nspread " in text


def test_errors_are_one_line(demo: FakeApiServer, kubeconfig: str, tmp_path: Path) -> None:
    dead = write_kubeconfig("http://127.0.0.1:9", str(tmp_path / "dead"))
    r = _run("snapshot", "--out", str(tmp_path / "o"), "--kubeconfig", dead, "--request-timeout", "2")
    _one_line_error(r, "hami: error: ")
    assert r.returncode == command.EXIT_UNREACHABLE and "cannot reach the API server" in r.stderr
    assert not (tmp_path / "o").exists()
    r = _run("simulate", "--from-cluster", "--kubeconfig", dead)
    _one_line_error(r, "hami: error: ")
    assert "cannot reach the API server" in r.stderr
    for argv in (["snapshot", "--out", str(tmp_path / "o")], ["simulate", "--from-cluster"]):
        r = _run(*argv, "--kubeconfig", str(tmp_path / "missing"))
        _one_line_error(r, "hami: error: kubeconfig")
        assert r.returncode == command.EXIT_USAGE
    bad = tmp_path / "bad"
    bad.write_text("clusters: [oops\n")
    _one_line_error(_run("snapshot", "--out", str(tmp_path / "o"), "--kubeconfig", str(bad)), "hami: error: ")
    (tmp_path / "file").write_text("x")
    r = _run("snapshot", "--out", str(tmp_path / "file"), "--kubeconfig", kubeconfig)
    _one_line_error(r, "hami: error: --out: ")
    _one_line_error(
        _run("simulate", "--kubeconfig", kubeconfig), "hami: error: --kubeconfig: only with --from-cluster"
    )
    _one_line_error(_run("simulate", "--from-cluster", "--nodes", "n.yaml", "--kubeconfig", kubeconfig),
                    "hami: error: --from-cluster: the cluster is the nodes; drop --nodes")  # fmt: skip
    _one_line_error(_run("snapshot"), "hami snapshot: the following arguments are required: --out")
