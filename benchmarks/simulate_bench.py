"""Benchmark: replay the full openb trace (1213 GPU nodes, default pod list) in fill mode to 130 %, or
a generated fleet of any size (`--generate 10000,30000`: the built-in generator, as `hami simulate
--generate`).

Prints wall time, pods/s and the per-pod decision latency: the time of the extender core's filter per
GPU pod (`ClusterState.filter`, once or twice: the replay hands it the best fitting nodes first, see
`hami.simulate.candidates`), over every node that kube-scheduler's CPU/memory fit keeps.
Targets (on the 2-core dev machine): openb full replay (load + replay) <= 20 s, p99 decision <= 5 ms;
a 10,000-node generated fleet filled to 130 % with the config's policies (binpack/spread) <= 60 s.

The dev machine is shared with other sessions, so a run can wait for a core. The script also prints
CPU time (of the process, and of each filter call on its own thread), and with `--repeat N` it
prints every run and then the best one, which is the closest to the uncontended cost.
Results and the command line are recorded in docs/benchmarks.md.

    python benchmarks/simulate_bench.py [--data-dir DIR] [--policy binpack] [--arrival 130] [--repeat 3] [--profile]
        [--config FILE]   # e.g. benchmarks/all-vendors.yaml: every vendor family enabled
    python benchmarks/simulate_bench.py --generate 10000,30000 --policy binpack/spread
"""

from __future__ import annotations

import argparse
import cProfile
import io
import math
import os
import platform
import pstats
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from hami.cluster import ClusterState
from hami.config import DeviceConfig, load_config_file
from hami.simulate import openb
from hami.simulate.engine import Mode, Policy, RunResult, parse_policy, run
from hami.simulate.generate import generate_default
from hami.simulate.workload import Workload

DEFAULT_DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "alibaba-gpu-v2023"
TARGET_WALL_S = 20.0
TARGET_P99_MS = 5.0
#: A generated fleet of this many nodes (or more), filled to 130 %: the replay's wall time target.
FLEET_NODES = 10_000
TARGET_FLEET_S = 60.0


@dataclass
class Figures:
    result: RunResult
    load_s: float
    replay_s: float
    replay_cpu_s: float
    cpu_lat: list[float]
    loadavg: float

    @property
    def wall_s(self) -> float:
        return self.load_s + self.replay_s

    def cpu_pct(self, q: float) -> float:
        xs = self.cpu_lat
        return xs[min(len(xs) - 1, max(0, math.ceil(q / 100 * len(xs)) - 1))] * 1000


def once(
    nodes_csv: Path | None,
    pods_csv: Path | None,
    policy: Policy,
    arrival: float,
    seed: int,
    prof: cProfile.Profile | None,
    cfg: DeviceConfig | None = None,
    generate: tuple[int, int] | None = None,
) -> Figures:
    """Load the trace (or generate the fleet: `generate` = (nodes, pods)) and replay it once; the filter
    is wrapped to take its thread CPU time too."""
    cfg = cfg or DeviceConfig()
    t0 = time.perf_counter()
    if generate is not None:
        workload = generate_default(config=cfg, seed=seed, nodes=generate[0], pods=generate[1])
    else:
        assert nodes_csv is not None and pods_csv is not None
        workload = Workload(openb.load_nodes(nodes_csv, config=cfg), openb.load_pods(pods_csv, config=cfg))
    load_s = time.perf_counter() - t0
    cpu_lat: list[float] = []
    real_filter = ClusterState.filter

    def timed_filter(self, pod, node_names, **kw):
        c0 = time.thread_time()
        try:
            return real_filter(self, pod, node_names, **kw)
        finally:
            cpu_lat.append(time.thread_time() - c0)

    ClusterState.filter = timed_filter  # type: ignore[method-assign]
    try:
        c1, t1 = time.process_time(), time.perf_counter()
        if prof is not None:
            prof.enable()
        r = run(workload, config=cfg, policy=policy, mode=Mode.FILL, arrival=arrival, seed=seed)
        if prof is not None:
            prof.disable()
        replay_s, replay_cpu_s = time.perf_counter() - t1, time.process_time() - c1
    finally:
        ClusterState.filter = real_filter  # type: ignore[method-assign]
    return Figures(r, load_s, replay_s, replay_cpu_s, sorted(cpu_lat), os.getloadavg()[0])


def line(f: Figures) -> str:
    r = f.result
    return (
        f"wall {f.wall_s:6.2f} s (load {f.load_s:.2f} + replay {f.replay_s:.2f})  CPU {f.replay_cpu_s:6.2f} s  "
        f"{r.pods / f.replay_s:5.0f} pods/s  decision p50 {r.decision_percentile_ms(50):.3f} ms "
        f"p99 {r.decision_percentile_ms(99):.3f} ms  (CPU p50 {f.cpu_pct(50):.3f} ms p99 {f.cpu_pct(99):.3f} ms)  "
        f"load avg {f.loadavg:.1f}"
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data-dir", type=Path, default=DEFAULT_DATA, help="folder with the openb CSV files")
    ap.add_argument("--nodes", default="openb_node_list_gpu_node.csv")
    ap.add_argument("--pods", default="openb_pod_list_default.csv")
    ap.add_argument("--policy", default="binpack", help="as `hami simulate --policy` (default binpack)")
    ap.add_argument("--arrival", type=float, default=130.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeat", type=int, default=1, help="runs; the best (lowest wall time) is summarised")
    ap.add_argument("--profile", action="store_true", help="also print the top functions by cumulative time")
    ap.add_argument("--config", type=Path, help="device config YAML (e.g. one enabling every vendor)")
    ap.add_argument(
        "--generate",
        metavar="NODES,PODS",
        help="the built-in generated fleet and workload of this size instead of the trace (seeded by --seed)",
    )
    args = ap.parse_args()
    cfg = load_config_file(args.config) if args.config else None

    generate = None
    nodes_csv: Path | None = args.data_dir / args.nodes
    pods_csv: Path | None = args.data_dir / args.pods
    if args.generate:
        n, _, p = args.generate.partition(",")
        if not (n.isdigit() and p.isdigit() and int(n) > 0 and int(p) > 0):
            print(f"--generate: {args.generate!r} must be NODES,PODS, e.g. 10000,30000", file=sys.stderr)
            return 2
        generate, nodes_csv, pods_csv = (int(n), int(p)), None, None
    elif not nodes_csv.exists() or not pods_csv.exists():
        print(f"trace files not found under {args.data_dir} (give --data-dir)", file=sys.stderr)
        return 2
    policy = parse_policy(args.policy)
    prof = cProfile.Profile() if args.profile else None
    print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}")
    source = (
        f"generated fleet of {generate[0]} nodes and {generate[1]} pods" if generate
        else f"{args.nodes} + {args.pods}"
    )  # fmt: skip
    print(f"run: {source}, fill to {args.arrival:g}% with seed {args.seed}, policy {policy.label}")
    print(f"load average before: {os.getloadavg()[0]:.1f}", flush=True)
    runs = []
    for i in range(max(1, args.repeat)):
        f = once(nodes_csv, pods_csv, policy, args.arrival, args.seed, prof, cfg, generate)
        runs.append(f)
        print(f"run {i + 1}: {line(f)}", flush=True)
    best = min(runs, key=lambda f: f.wall_s)
    r = best.result
    filter_s = sum(r.decision_s)
    p99 = r.decision_percentile_ms(99) or 0.0
    print()
    print(f"input: {r.nodes} nodes / {r.gpus} GPUs")
    print(f"pods submitted: {r.pods} ({r.gpu_pods} GPU pods), scheduled {r.scheduled}, failed {r.failed}")
    print(
        f"GPU allocation {r.gpu_allocation_ratio * 100:.2f}%, first GPU failure at {r.first_failure_arrival:.1f}%"
    )
    print(f"best of {len(runs)}: {line(best)}")
    print(
        f"decision latency (n={len(r.decision_s)}): mean {filter_s / len(r.decision_s) * 1000:.3f} ms, "
        f"max {max(r.decision_s) * 1000:.3f} ms; time in filter {filter_s:.2f} s of {best.replay_s:.2f} s replay "
        f"({filter_s / best.replay_s * 100:.0f}%)"
    )
    if prof is not None:
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats("cumulative").print_stats(25)
        print(out.getvalue())
    if generate is not None:
        if generate[0] >= FLEET_NODES:
            ok = best.replay_s <= TARGET_FLEET_S
            print(
                f"target ({FLEET_NODES} nodes: replay <= {TARGET_FLEET_S:g} s): "
                + ("met" if ok else f"NOT met (replay {best.replay_s:.1f} s, CPU {best.replay_cpu_s:.1f} s)")
            )
        return 0
    ok = best.wall_s <= TARGET_WALL_S and p99 <= TARGET_P99_MS
    print(
        f"targets (wall <= {TARGET_WALL_S:g} s, p99 <= {TARGET_P99_MS:g} ms): " + ("met" if ok else "NOT met")
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
