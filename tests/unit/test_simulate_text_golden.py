"""Golden outputs of the simulator's text: the summary of a replay (fill with --compare, trace, a mixed
fleet, a start state with a cordoned node) and the what-if's counts, byte for byte.

The replay's timings (decision ms, wall time) are set to fixed figures before the summary is printed, so
the golden files hold every other character as the command prints it. Regenerate after a deliberate
change with ``UPDATE_GOLDEN=1 python -m pytest tests/unit/test_simulate_text_golden.py``.
"""

from __future__ import annotations

import argparse

import pytest
import yaml

from hami import annotations as A
from hami import cli
from hami.config import DeviceConfig
from hami.model import ContainerDevice
from hami.simulate import kubeyaml
from hami.simulate.engine import Mode, Policy, RunResult, parse_policy, run
from hami.simulate.generate import generate_default
from hami.simulate.mixed import config_for, generate_mixed, parse_vendor_shares
from hami.simulate.report import summary_text
from hami.simulate.start import split
from hami.simulate.workload import DEFAULT_GPU_MODELS, Workload, gpu_node
from tests.golden_text import GOLDEN as GOLDEN_ROOT
from tests.golden_text import check_golden

CFG = DeviceConfig()
GOLDEN = GOLDEN_ROOT / "simulate"


def _golden(name: str, text: str) -> None:
    check_golden("simulate", name, text)


def _timed(r: RunResult, k: int) -> RunResult:
    """`r` with fixed timings (the only figures of the summary a busy machine changes)."""
    r.elapsed_s = 1.25 + k
    r.decision_s = [0.0004 * (k + 1), 0.0011 * (k + 1), 0.0031 * (k + 1)]
    return r


def _runs(
    workload: Workload, policies: str, mode: Mode, *, config: DeviceConfig = CFG, **kw: object
) -> list[RunResult]:
    return [
        _timed(run(workload, config=config, policy=parse_policy(p), mode=mode, seed=1, **kw), k)
        for k, p in enumerate(policies.split(","))
    ]


def test_fill_compare_summary() -> None:
    w = generate_default(config=CFG, seed=4, nodes=40, pods=500)
    text = summary_text(_runs(w, "binpack,spread,fragmentation/binpack", Mode.FILL), w)
    assert "most fragmented nodes, spread" in text and "most common failure reasons" in text
    _golden("summary-fill-compare.txt", text + "\n")


def test_trace_summary() -> None:
    w = generate_default(config=CFG, seed=5, nodes=30, pods=400)
    text = summary_text(_runs(w, "binpack,spread", Mode.TRACE), w)
    assert "peak capacity" in text and "checkpoint of highest capacity taken" in text
    _golden("summary-trace.txt", text + "\n")


def test_mixed_fleet_summary() -> None:
    shares = parse_vendor_shares("nvidia=50,ascend=25,amd=25")
    config = config_for(CFG, shares)
    w = generate_mixed(config=config, shares=shares, nodes=24, pods=300, seed=2)
    text = summary_text(_runs(w, "binpack,spread", Mode.FILL, config=config), w)
    assert "allocation per vendor family" in text
    _golden("summary-mixed.txt", text + "\n")


def _card_node(name: str, gpus: int, *, cordoned: bool = False):
    n = gpu_node(name, cpu_milli=8000, memory_mib=65536, gpus=gpus, model="T4",
                 card_mib=DEFAULT_GPU_MODELS["T4"], config=CFG)  # fmt: skip
    if cordoned:
        n.obj.setdefault("spec", {})["unschedulable"] = True
    return n


def test_start_and_cordoned_summary() -> None:
    nodes = [_card_node("n0", 2), _card_node("n1", 2), _card_node("off", 2, cordoned=True)]
    manifests = []
    for k, (node, card, mem, cores) in enumerate((("n0", 0, 12000, 75), ("off", 1, 4000, 30))):
        uuid = next(n for n in nodes if n.name == node).cards[card].uuid
        manifests.append({
            "kind": "Pod",
            "metadata": {"name": f"held-{k}", "namespace": "default", "annotations": {
                A.NVIDIA_ALLOCATED: A.encode_pod_devices([[ContainerDevice(uuid, "NVIDIA", mem, cores)]]),
                A.ASSIGNED_NODE: node,
            }},
            "spec": {"schedulerName": CFG.scheduler.schedulerName, "nodeName": node, "containers": [{
                "name": "c", "resources": {
                    "limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": str(mem),
                               "nvidia.com/gpucores": str(cores)},
                    "requests": {"cpu": "2", "memory": "1Gi"}}}]},
            "status": {"phase": "Running"},
        })  # fmt: skip
    text = yaml.safe_dump_all(manifests)
    placed, _ = split(kubeyaml.load_pods("pods.yaml", config=CFG, text=text), CFG)
    pool = generate_default(config=CFG, seed=3, nodes=4, pods=60).pods
    w = Workload(nodes, pool, nodes_source="nodes.yaml", pods_source="pods.yaml")
    results = [
        _timed(run(w, config=CFG, policy=p, mode=Mode.FILL, seed=2, arrival=90, placed=placed), k)
        for k, p in enumerate((Policy("binpack", "binpack"), Policy("spread", "spread")))
    ]
    text = summary_text(results, w)
    assert "most fragmented nodes at the start" in text and "cordoned (take no new pod" in text
    _golden("summary-start-cordoned.txt", text + "\n")


@pytest.mark.parametrize(
    ("name", "argv"),
    [
        ("whatif-generated.txt",
         ["--generate", "20,100", "--what-if-shape", "nvidia.com/gpu=2,nvidia.com/gpumem=3000",
          "--what-if-shape", "nvidia.com/gpu=1,nvidia.com/gpucores=30,cpu=4", "--compare", "binpack,spread"]),
        ("whatif-current-policy.txt",
         ["--generate", "12,50", "--what-if-shape", "nvidia.com/gpu=1,nvidia.com/gpumem=2000",
          "--current-policy", "spread", "--compare", "binpack,spread,fragmentation"]),
    ],
)  # fmt: skip
def test_what_if_text(name: str, argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["simulate", *argv]) == 0
    out = capsys.readouterr().out
    assert "pods fit" in out
    _golden(name, out)


def test_summary_of_one_policy_through_the_command(capsys: pytest.CaptureFixture[str], monkeypatch) -> None:
    # The command's own path (start line, notes), with the engine's timings fixed.
    from hami.simulate import command

    real = command.run

    def fixed(*a: object, **kw: object) -> RunResult:
        return _timed(real(*a, **kw), 0)

    monkeypatch.setattr(command, "run", fixed)
    assert cli.main(["simulate", "--generate", "16,150", "--seed", "3", "--arrival", "80"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("hami simulate - fill mode")
    _golden("summary-command.txt", out)


def test_goldens_are_not_empty_tables() -> None:
    # A golden that lost its tables (a printer that writes nothing) must not pass as current.
    tables = [*GOLDEN.glob("summary-*.txt"), *GOLDEN.glob("whatif-*.txt")]
    assert len(tables) == 7
    for path in tables:
        body = path.read_text(encoding="utf-8")
        assert "policy  " in body and "--------" in body, path.name


def test_simulate_help() -> None:
    # What `hami simulate --help` is made of, flag by flag: argparse's own layout of it changes between
    # Python versions (3.13 writes short and long options apart, 3.14 colours), the flags do not.
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    simulate = sub.choices["simulate"]
    rows = [f"description: {simulate.description!r}", f"epilog: {simulate.epilog!r}"]
    for action in simulate._actions:
        rows.append(
            " | ".join(
                repr(x)
                for x in (
                    action.option_strings or action.dest,
                    action.dest,
                    action.nargs,
                    action.default,
                    action.choices,
                    action.metavar,
                    action.help,
                )
            )
        )
    out = "\n".join(rows) + "\n"
    assert "--what-if-shape" in out and "--from-cluster" in out
    check_golden("simulate", "simulate-help-actions.txt", out)
