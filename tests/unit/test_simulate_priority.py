"""`hami simulate` with priorities: pods that do not fit wait in kube-scheduler's order, and with
`--preemption on` evict lower-priority pods chosen by the extender's victim choice. Hand-worked traces
on one node with one 16384 MiB card."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from hami.cli import main
from hami.simulate.priority import assign, parse_qos_map
from hami.simulate.workload import Workload

NODES = "sn,cpu_milli,memory_mib,gpu,model\nn0,64000,262144,1,V100M16\n"
HEADER = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n"


def simulate(tmp_path: Path, rows: list[str], *flags: str) -> dict:
    (tmp_path / "nodes.csv").write_text(NODES)
    (tmp_path / "pods.csv").write_text(HEADER + "".join(r + "\n" for r in rows))
    out, err = io.StringIO(), io.StringIO()
    import contextlib

    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(
            ["simulate", "--nodes", str(tmp_path / "nodes.csv"), "--pods", str(tmp_path / "pods.csv"),
             "--mode", "trace", "--no-progress", "--json", *flags]
        )  # fmt: skip
    assert code == 0, err.getvalue()
    return json.loads(out.getvalue())


# low holds the whole card from 0 to 100 s; high (LS) arrives at 10 s and runs until 200 s.
WHOLE_CARD = [
    "low,1000,1024,1,1000,,BE,Running,0,100,0",
    "high,1000,1024,1,1000,,LS,Running,10,200,10",
]


def test_without_preemption_the_high_priority_pod_waits_for_the_card(tmp_path: Path) -> None:
    r = simulate(tmp_path, WHOLE_CARD, "--priorities", "qos", "--preemption", "off")
    p = r["priorities"]
    assert (p["preemption"], p["preemptions"], p["evictions"]) == ("off", 0, 0)
    high = p["classes"]["1000"]
    # low leaves at 100 s: high, waiting since 10 s, is placed then.
    assert (high["pods"], high["placed"], high["never_placed"], high["waited"]) == (1, 1, 0, 1)
    assert (high["wait_mean_s"], high["wait_max_s"]) == (90.0, 90.0)
    assert r["scheduled"] == 2 and r["failed"] == 0


def test_with_preemption_the_high_priority_pod_evicts_and_runs_at_once(tmp_path: Path) -> None:
    r = simulate(tmp_path, WHOLE_CARD, "--priorities", "qos", "--preemption", "on")
    p = r["priorities"]
    assert (p["preemption"], p["preemptions"], p["evictions"]) == ("on", 1, 1)
    high, low = p["classes"]["1000"], p["classes"]["0"]
    assert (high["placed"], high["wait_max_s"]) == (1, 0.0)
    # The evicted pod waits again (the card is high's until 200 s) and its own trace ends at 100 s.
    assert (low["pods"], low["placed"], low["evicted"], low["never_placed"]) == (1, 1, 1, 0)


def test_the_minimal_victim_is_evicted(tmp_path: Path) -> None:
    # Three BE pods: a (8000 MiB, 50 %), b and c (4000 MiB, 25 % each). high asks 50 % of the card
    # (8192 MiB, 50 %): evicting a alone frees enough; b and c together would too, with two pods.
    rows = [
        "a,1000,1024,1,500,,BE,Running,0,1000,0",
        "b,1000,1024,1,250,,BE,Running,1,1000,1",
        "c,1000,1024,1,250,,BE,Running,2,1000,2",
        "high,1000,1024,1,500,,LS,Running,10,1000,10",
    ]
    r = simulate(
        tmp_path, rows, "--priorities", "qos", "--preemption", "on", "--placements", str(tmp_path / "p.csv")
    )
    p = r["priorities"]
    assert (p["preemptions"], p["evictions"]) == (1, 1)
    # One eviction that makes room can only be a (b or c alone frees 4096 MiB, 25 %).
    assert p["classes"]["0"]["evicted"] == 1


def test_equal_priorities_never_preempt(tmp_path: Path) -> None:
    rows = ["low,1000,1024,1,1000,,BE,Running,0,100,0", "low2,1000,1024,1,1000,,BE,Running,10,200,10"]
    p = simulate(tmp_path, rows, "--priorities", "qos", "--preemption", "on")["priorities"]
    assert (p["preemptions"], p["evictions"]) == (0, 0)
    assert p["classes"]["0"]["wait_max_s"] == 90.0


def test_a_pod_deleted_while_waiting_is_never_placed(tmp_path: Path) -> None:
    rows = ["low,1000,1024,1,1000,,BE,Running,0,100,0", "brief,1000,1024,1,1000,,LS,Running,10,50,10"]
    r = simulate(tmp_path, rows, "--priorities", "qos", "--preemption", "off")
    assert r["priorities"]["classes"]["1000"]["never_placed"] == 1
    assert r["failed"] == 1


def test_flags_outside_trace_mode_and_bad_specs_are_refused(tmp_path: Path) -> None:
    (tmp_path / "nodes.csv").write_text(NODES)
    (tmp_path / "pods.csv").write_text(HEADER + WHOLE_CARD[0] + "\n")
    err = io.StringIO()
    import contextlib

    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = main(["simulate", "--nodes", str(tmp_path / "nodes.csv"), "--pods", str(tmp_path / "pods.csv"),
                     "--preemption", "on", "--no-progress"])  # fmt: skip
    assert code != 0 and "--preemption: only with --mode trace" in err.getvalue()
    with pytest.raises(Exception, match="QOS=INTEGER"):
        parse_qos_map("LS=high")
    with pytest.raises(Exception, match="mix:PCT"):
        assign(Workload(nodes=[], pods=[]), "mix:0", pods_file=None, seed=0)
    with pytest.raises(Exception, match="want qos"):
        assign(Workload(nodes=[], pods=[]), "random", pods_file=None, seed=0)
