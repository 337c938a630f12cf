"""`hami simulate --from-cluster` starting from the cluster as it is, and `--what-if-shape`, against the
in-memory API server seeded with a tiny hand-built cluster whose answers are worked out by hand here.

The cluster: two nodes of three 10000 MiB cards each (100 % cores, 10 slots per card); one running pod
holds 4000 MiB and 30 % on cards a-0 and a-1 (a two-card container).

The shape ``nvidia.com/gpu=2,nvidia.com/gpumem=4000,nvidia.com/gpucores=30``: two cards of one node,
each with 4000 MiB and 30 % free. An empty card takes it twice (memory: 10000 // 4000 = 2; cores: 3);
a-0 and a-1 once more each (6000 MiB free). Per node, in cards' remaining uses:

* card binpack (fullest cards first): node a (1, 1, 2) -> the pod takes a-0 + a-1 -> (0, 0, 2): 1 pod;
  node b (2, 2, 2) -> b-0 + b-1 -> (1, 1, 2) -> b-0 + b-1 again -> (0, 0, 2): 2 pods. Total 3.
* card spread (emptiest cards first): node a -> a-2 + a-0 -> (0, 1, 1) -> a-2 + a-1: 2 pods; node b ->
  b-0 + b-1 -> (1, 1, 2) -> b-2 + b-0 -> (0, 1, 1) -> b-2 + b-1: 3 pods. Total 5.

The node policy only orders the nodes, so `binpack` (node and card binpack) fits 3, `spread` 5, and the
config's default `binpack/spread` 5. From empty cards node a behaves as node b: binpack 4, spread 6.
"""

from __future__ import annotations

import csv
import io
import json
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any

import pytest
import yaml

from hami import cli
from hami.tools import command
from kubefakes.apiserver import FakeApiServer, write_kubeconfig
from kubefakes.demo_cluster import DEMO_NOW, cards, device_configmap, limits, node, pod

SHAPE = "nvidia.com/gpu=2,nvidia.com/gpumem=4000,nvidia.com/gpucores=30"
A = cards("a", 3, 10000, "NVIDIA-T4")
B = cards("b", 3, 10000, "NVIDIA-T4")


def _held(**kw: Any) -> dict[str, Any]:
    return pod("default", "held", [("c", limits(2, 4000, 30))], node="node-a",
               cards=[[(A[0].uuid, 4000, 30), (A[1].uuid, 4000, 30)]], **kw)  # fmt: skip


@pytest.fixture
def tiny(fake_apiserver: FakeApiServer) -> FakeApiServer:
    store = fake_apiserver.store
    store.create_any({"kind": "Namespace", "metadata": {"name": "default"}})
    # The chart's device ConfigMap, which --from-cluster reads the nodes and pods with.
    store.create_any({"kind": "Namespace", "metadata": {"name": "hami-system"}})
    store.create_any(device_configmap())
    store.create_any(node("node-a", A, now=DEMO_NOW))
    store.create_any(node("node-b", B, now=DEMO_NOW))
    store.create_any(_held())
    # Not placed by the rule: finished, or filtered but not bound (no bind phase yet).
    store.create_any(pod("default", "done", [("c", limits(1, 9000, 90))], node="node-b",
                         cards=[[(B[0].uuid, 9000, 90)]], phase="Succeeded"))  # fmt: skip
    return fake_apiserver


def _json(*argv: str) -> tuple[int, dict[str, Any]]:
    out = io.StringIO()
    with redirect_stdout(out):
        code = cli.main(list(argv))
    return code, json.loads(out.getvalue()) if code == 0 else {}


def _fits(res: dict[str, Any]) -> dict[str, tuple[int, int]]:
    (one,) = res["what_if"]
    return {label: (p["fit"], p["vs_current"]) for label, p in one["policies"].items()}


def test_what_if_counts_the_pods_of_a_shape_per_policy_from_the_live_state(
    tiny: FakeApiServer, kubeconfig: str
) -> None:
    before = tiny.store.resource_version
    code, res = _json("simulate", "--from-cluster", "--kubeconfig", kubeconfig, "--what-if-shape", SHAPE,
                      "--compare", "binpack,spread", "--json")  # fmt: skip
    assert code == 0 and tiny.store.resource_version == before  # read-only
    assert (res["nodes"], res["gpus"], res["current_policy"]) == (2, 6, "binpack/spread")
    # The held pod: 2 x 30 % of 600 % cores, 2 x 4000 of 60000 MiB; the finished one holds nothing.
    assert res["start"] == {
        "from_empty": False, "replayed_by_trace": 0, "source": "cluster", "placed_pods": 1, "skipped_pods": 0,
        "pods_on_cards": 1, "cards_used": 2, "cards": 6, "gpu_allocation_ratio": 0.1,
        "memory_allocation_ratio": round(8000 / 60000, 6),
        # each held card: 4000 of 10000 MiB binds it (more than its 30 % of cores)
        "capacity_allocation_ratio": round(2 * 0.4 / 6, 6),
    }  # fmt: skip
    assert _fits(res) == {"binpack/spread": (5, 0), "binpack": (3, -2), "spread": (5, 0)}
    (one,) = res["what_if"]
    assert one["shape"] == SHAPE and one["cap"] == 61  # 60 card slots + 1
    spread = one["policies"]["spread"]
    assert spread["capped"] is False and spread["stopped_by"] == "CardInsufficientMemory"
    # 5 pods x 2 cards x 30 % + the held 60 % of 600 %; 40000 + 8000 of 60000 MiB.
    assert (spread["gpu_allocation_ratio"], spread["memory_allocation_ratio"]) == (0.6, 0.8)
    assert spread["capacity_allocation_ratio"] == 0.8  # memory binds every card
    assert one["policies"]["binpack"]["gpu_allocation_ratio"] == 0.4  # (3 x 60 + 60) / 600

    code, empty = _json("simulate", "--from-cluster", "--kubeconfig", kubeconfig, "--what-if-shape", SHAPE,
                        "--compare", "binpack,spread", "--from-empty", "--json")  # fmt: skip
    assert code == 0 and empty["start"]["from_empty"] is True and empty["start"]["cards_used"] == 0
    assert _fits(empty) == {"binpack/spread": (6, 0), "binpack": (4, -2), "spread": (6, 0)}

    # Against another current policy; the current one is counted even when not in the list.
    code, res = _json("simulate", "--from-cluster", "--kubeconfig", kubeconfig, "--what-if-shape", SHAPE,
                      "--policy", "spread", "--current-policy", "binpack", "--json")  # fmt: skip
    assert code == 0 and res["current_policy"] == "binpack"
    assert _fits(res) == {"binpack": (3, 0), "spread": (5, 2)}


def test_what_if_text_and_several_shapes(
    tiny: FakeApiServer, kubeconfig: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # One card of 8000 MiB: a-0 and a-1 have 6000 free (none), a-2 and node b's cards one each: 4 pods.
    whole = "nvidia.com/gpu=1,nvidia.com/gpumem=8000,cpu=1,memory=1Gi"
    assert cli.main(["simulate", "--from-cluster", "--kubeconfig", kubeconfig, "--what-if-shape", SHAPE,
                     "--what-if-shape", whole, "--compare", "binpack,spread"]) == 0  # fmt: skip
    text = capsys.readouterr().out
    assert (
        "start: 1 pod already placed and kept in place (1 on cards) from cluster: 2 of 6 GPUs in use" in text
    )
    assert "current policy: binpack/spread (the config's scheduler policies)" in text
    rows = {
        line.split()[0]: line.split()[1:3]
        for line in text.splitlines()
        if line.startswith(("binpack", "spread"))
    }
    assert rows == {"binpack/spread": ["4", "(current)"], "binpack": ["4", "+0"], "spread": ["4", "+0"]}
    sections = text.split("\nshape ")
    assert len(sections) == 3 and sections[1].startswith(SHAPE) and sections[2].startswith(whole)
    first = {
        line.split()[0]: line.split()[1:3]
        for line in sections[1].splitlines()[1:]
        if line.startswith(("b", "s"))
    }
    assert first == {"binpack/spread": ["5", "(current)"], "binpack": ["3", "-2"], "spread": ["5", "+0"]}


def test_placed_pods_keep_their_cards_in_a_fill_replay(
    tiny: FakeApiServer, kubeconfig: str, tmp_path: Path
) -> None:
    # 7000 MiB and 50 % per pod: a-0 and a-1 (6000 MiB free) can take none while the held pod is there.
    workload = tmp_path / "pods.yaml"
    workload.write_text(yaml.safe_dump({"kind": "Pod", "metadata": {"name": "big"}, "spec": {"containers": [
        {"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "7000",
                                               "nvidia.com/gpucores": "50"}}}]}}))  # fmt: skip

    def cards_used(*extra: str) -> tuple[dict[str, Any], dict[str, int]]:
        placements = tmp_path / "p.csv"
        code, res = _json("simulate", "--from-cluster", "--kubeconfig", kubeconfig, "--pods", str(workload),
                          "--placements", str(placements), "--json", *extra)  # fmt: skip
        assert code == 0
        used: dict[str, int] = {}
        for row in csv.DictReader(placements.open()):
            if row["card_uuid"]:
                used[row["card_uuid"]] = used.get(row["card_uuid"], 0) + int(row["mem_mib"])
        return res, used

    res, used = cards_used()
    assert set(used) == {A[2].uuid, B[0].uuid, B[1].uuid, B[2].uuid}
    assert all(v == 7000 for v in used.values()) and res["scheduled"] == 4
    # The held pod's 2 x 30 % stay allocated: (4 x 50 % + 60 %) of 600 %; (4 x 7000 + 8000) of 60000 MiB.
    assert res["gpu_allocation_ratio"] == pytest.approx(260 / 600)
    assert res["memory_allocation_ratio"] == pytest.approx(36000 / 60000)
    assert res["start"]["placed_pods"] == 1 and res["start"]["gpu_allocation_ratio"] == 0.1
    res, used = cards_used("--from-empty")
    assert set(used) == {c.uuid for c in (*A, *B)} and res["scheduled"] == 6
    assert res["start"]["from_empty"] is True


def test_the_snapshot_replays_to_the_same_start_and_counts(
    tiny: FakeApiServer, kubeconfig: str, tmp_path: Path
) -> None:
    tiny.store.create_any(pod("default", "binding", [("c", limits(1, 3000, 10))], node="node-b",
                              cards=[[(B[2].uuid, 3000, 10)]], bind_phase="allocating"))  # fmt: skip
    assert cli.main(["snapshot", "--out", str(tmp_path), "--kubeconfig", kubeconfig]) == 0
    files = ("--nodes", str(tmp_path / "nodes.yaml"), "--pods", str(tmp_path / "pods.yaml"))
    live_args = ("--from-cluster", "--kubeconfig", kubeconfig)
    for extra in (("--what-if-shape", SHAPE, "--compare", "binpack,spread"), ("--seed", "3")):
        code, live = _json("simulate", *live_args, *extra, "--json")
        assert code == 0
        code, saved = _json("simulate", *files, *extra, "--json")
        assert code == 0
        # Being bound (hami.io/bind-phase allocating, no spec.nodeName yet) counts as placed.
        assert live["start"]["placed_pods"] == saved["start"]["placed_pods"] == 2
        assert {k: v for k, v in live["start"].items() if k != "source"} == {
            k: v for k, v in saved["start"].items() if k != "source"
        }
        assert saved["start"]["source"] == str(tmp_path / "pods.yaml")
        if "what_if" in live:
            assert live["what_if"] == saved["what_if"]
        else:
            for key in ("pods", "scheduled", "failed", "gpu_allocation_ratio", "memory_allocation_ratio"):
                assert live[key] == saved[key], key


def test_trace_mode_does_not_keep_the_pods_it_replays(tiny: FakeApiServer, kubeconfig: str) -> None:
    code, res = _json("simulate", "--from-cluster", "--kubeconfig", kubeconfig, "--mode", "trace", "--json")
    assert code == 0
    assert res["start"]["replayed_by_trace"] == 1 and res["start"]["placed_pods"] == 0


@pytest.mark.parametrize(
    ("shape", "starts"),
    [
        ("", "hami: error: --what-if-shape: empty shape"),
        ("nvidia.com/gpumemory=8000", "hami: error: --what-if-shape: 'nvidia.com/gpumemory' is not a resource name; "
         "valid: cpu, memory, nvidia.com/gpu, nvidia.com/gpumem, nvidia.com/gpumem-percentage, nvidia.com/gpucores"),
        ("nvidia.com/gpu=1,nvidia.com/gpumem=lots", "hami: error: --what-if-shape: nvidia.com/gpumem: 'lots' is not"),
        ("nvidia.com/gpu", "hami: error: --what-if-shape: 'nvidia.com/gpu' must be NAME=QUANTITY"),
        ("nvidia.com/gpu=1,nvidia.com/gpu=2", "hami: error: --what-if-shape: nvidia.com/gpu given twice"),
        ("cpu=4", "hami: error: --what-if-shape: 'cpu=4' asks for no device; add a count such as nvidia.com/gpu=1"),
        ("nvidia.com/gpu=1.5", "hami: error: --what-if-shape: 'nvidia.com/gpu=1.5': resources.limits[nvidia.com/gpu]: "
         "'1.5' is not a whole number of devices"),
    ],
)  # fmt: skip
def test_bad_shapes_are_one_line_naming_the_flag(
    tiny: FakeApiServer, kubeconfig: str, capsys: pytest.CaptureFixture[str], shape: str, starts: str
) -> None:
    assert cli.main(["simulate", "--from-cluster", "--kubeconfig", kubeconfig, "--what-if-shape", shape]) == 2
    err = capsys.readouterr().err
    assert err.startswith(starts) and err.count("\n") == 1, err


def test_flags_that_have_no_meaning_together(
    tiny: FakeApiServer, kubeconfig: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    live = ["simulate", "--from-cluster", "--kubeconfig", kubeconfig]
    for extra, starts in (
        (["--current-policy", "spread"], "hami: error: --current-policy: only with --what-if-shape"),
        (["--what-if-shape", SHAPE, "--current-policy", "tightest"], "hami: error: --current-policy: 'tightest' is not a policy"),
        (["--what-if-shape", SHAPE, "--arrival", "50"], "hami: error: --arrival: not with --what-if-shape"),
        (["--what-if-shape", SHAPE, "--mode", "trace"], "hami: error: --mode trace: not with --what-if-shape"),
    ):  # fmt: skip
        assert cli.main(live + extra) == 2
        err = capsys.readouterr().err
        assert err.startswith(starts) and err.count("\n") == 1, err


def test_cluster_errors_exit_as_hami_snapshot(
    tiny: FakeApiServer, kubeconfig: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dead = write_kubeconfig("http://127.0.0.1:9", str(tmp_path / "dead"))
    for extra in ([], ["--what-if-shape", SHAPE]):
        assert (
            cli.main(["simulate", "--from-cluster", "--kubeconfig", dead, *extra]) == command.EXIT_UNREACHABLE
        )
        err = capsys.readouterr().err
        assert "cannot reach the API server" in err and "check --kubeconfig" in err and err.count("\n") == 1
    tiny.faults.add(verb="list", resource="nodes", status=403, times=1)
    assert cli.main(["simulate", "--from-cluster", "--kubeconfig", kubeconfig]) == command.EXIT_FORBIDDEN
    err = capsys.readouterr().err
    assert err.startswith("hami: error: ") and "get/list on nodes, pods and resourcequotas" in err
    assert (
        cli.main(["simulate", "--from-cluster", "--kubeconfig", str(tmp_path / "missing")])
        == command.EXIT_USAGE
    )
    assert capsys.readouterr().err.startswith("hami: error: kubeconfig")


def test_simulate_doc_examples_are_current() -> None:
    """The cluster transcripts of docs/simulate.md are what their commands print (scripts/gen_simulate_doc.py)."""
    import importlib.util

    root = Path(__file__).resolve().parents[2]
    spec = importlib.util.spec_from_file_location(
        "gen_simulate_doc", root / "scripts" / "gen_simulate_doc.py"
    )
    assert spec is not None and spec.loader is not None
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    page = (root / "docs" / "simulate.md").read_text(encoding="utf-8")
    assert page.count("<!-- simulate-example: ") >= 1
    assert gen.render(page) == page, "docs/simulate.md is stale: run python scripts/gen_simulate_doc.py"


def test_progress_prints_a_line_per_policy(
    tiny: FakeApiServer, kubeconfig: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["simulate", "--from-cluster", "--kubeconfig", kubeconfig, "--what-if-shape", SHAPE]
    assert cli.main([*argv, "--compare", "binpack,spread", "--progress", "--json"]) == 0
    out, err = capsys.readouterr()
    assert _fits(json.loads(out)) == {"binpack/spread": (5, 0), "binpack": (3, -2), "spread": (5, 0)}
    lines = err.splitlines()
    assert [line.split(" (")[0] for line in lines] == [
        "what-if binpack/spread: 5 pods fit", "what-if binpack: 3 pods fit", "what-if spread: 5 pods fit"
    ]  # fmt: skip
    assert cli.main(argv) == 0 and capsys.readouterr().err == ""  # stderr is no terminal here


def test_a_cluster_without_pods_needs_no_workload_for_the_what_if(
    fake_apiserver: FakeApiServer, kubeconfig: str, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_apiserver.store.create_any(node("node-a", A, now=DEMO_NOW))
    code, res = _json(
        "simulate", "--from-cluster", "--kubeconfig", kubeconfig, "--what-if-shape", SHAPE, "--json"
    )
    # One node of three empty cards under binpack/spread: a-0 + a-1, a-2 + a-0, a-1 + a-2.
    assert code == 0 and _fits(res) == {"binpack/spread": (3, 0)}
    assert res["start"]["placed_pods"] == 0
    assert cli.main(["simulate", "--from-cluster", "--kubeconfig", kubeconfig]) == 2
    assert (
        "the API server lists no Pod to resample; give the workload with --pods FILE"
        in capsys.readouterr().err
    )
