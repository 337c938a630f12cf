"""Placement quality of every policy on the Alibaba v2023 openb traces: GPU allocation at a fill target.

For each trace (pod list) and each seed, replays the same pod stream (fill mode, drawn with replacement
until the arrived GPU demand reaches `--arrival` percent of the 6212 GPUs) under each policy and prints
one line per run, then per trace and policy the mean, the spread (min..max) and the standard deviation
over the seeds. Same replay as `hami simulate --compare ...` (hami.simulate.engine.run).

    python benchmarks/fragmentation_compare.py [--data-dir DIR] [--traces default,gpushare40,...]
        [--policies binpack,spread,spread/binpack,fragmentation] [--seeds 1,2,3,4,5] [--arrival 130]
        [--jobs N]   # (trace, seed) pairs in N processes at once; lines come out in the same order

Each line gives the decision time (one `ClusterState.filter`) as wall-clock p50/p99 (the replay's own
figures) and as CPU time of the calling thread p50/p99 (measured here around each filter): on a shared,
loaded machine the wall figures include the time other processes held the core, the CPU figures less so.

With `--jobs` above 1 the runs share the machine's cores, so decision times are per run on a busy
machine only when there are fewer free cores than jobs (the script prints the load average at the end).

Results and the command line are recorded in docs/benchmarks.md. Never run as a test.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from hami.cluster import ClusterState
from hami.config import DeviceConfig
from hami.simulate import openb
from hami.simulate.engine import Mode, parse_policy, run
from hami.simulate.workload import Workload

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "alibaba-gpu-v2023"

_CPU_S: list[float] = []  # CPU seconds of each filter of the current run (this process)


def _timed_filter(filter_):
    def timed(self, *args, **kwargs):
        t0 = time.thread_time()
        try:
            return filter_(self, *args, **kwargs)
        finally:
            _CPU_S.append(time.thread_time() - t0)

    return timed


ClusterState.filter = _timed_filter(ClusterState.filter)


def _percentile_ms(xs: list[float], q: float) -> float:
    """Nearest-rank percentile in ms, as `SimulationResult.decision_percentile_ms`."""
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, math.ceil(q / 100 * len(xs)) - 1))] * 1000


def _runs(
    data_dir: Path, trace: str, seed: int, policies: list[str], arrival: float
) -> list[tuple[str, float, str]]:
    """(policy label, GPU allocation percent, printed line) of each policy on one (trace, seed)."""
    cfg = DeviceConfig()
    nodes_csv = data_dir / "openb_node_list_gpu_node.csv"
    pods_csv = data_dir / f"openb_pod_list_{trace}.csv"
    workload = Workload(openb.load_nodes(nodes_csv, config=cfg), openb.load_pods(pods_csv, config=cfg))
    out = []
    for policy in map(parse_policy, policies):
        t0 = time.perf_counter()
        _CPU_S.clear()
        r = run(workload, config=cfg, policy=policy, mode=Mode.FILL, arrival=arrival, seed=seed)
        line = (
            f"{trace:<12} seed {seed}  {policy.label:<16} GPU alloc {r.gpu_allocation_ratio * 100:6.2f} %  "
            f"failed {r.failed:5d}  p50/p99 {r.decision_percentile_ms(50):.2f}/"
            f"{r.decision_percentile_ms(99):.2f} ms  cpu p50/p99 {_percentile_ms(_CPU_S, 50):.2f}/"
            f"{_percentile_ms(_CPU_S, 99):.2f} ms  {time.perf_counter() - t0:5.1f} s"
        )
        out.append((policy.label, r.gpu_allocation_ratio * 100, line))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data-dir", type=Path, default=DATA)
    ap.add_argument("--traces", default="default")
    ap.add_argument("--policies", default="binpack,spread,spread/binpack,fragmentation")
    ap.add_argument("--seeds", default="1,2,3,4,5")
    ap.add_argument("--arrival", type=float, default=130.0)
    ap.add_argument("--jobs", type=int, default=1, help="(trace, seed) pairs run at once (processes)")
    args = ap.parse_args()
    if not (args.data_dir / "openb_node_list_gpu_node.csv").exists():
        print(f"no trace at {args.data_dir} (give --data-dir)", file=sys.stderr)
        return 2
    policies = args.policies.split(",")
    labels = [parse_policy(p).label for p in policies]
    seeds = [int(s) for s in args.seeds.split(",")]
    pairs = [(t, s) for t in args.traces.split(",") for s in seeds]
    got: dict[tuple[str, str], list[float]] = {}
    jobs = max(1, args.jobs)
    if jobs > 1:
        pool = ProcessPoolExecutor(jobs)
        results = [pool.submit(_runs, args.data_dir, t, s, policies, args.arrival) for t, s in pairs]
        outputs = (f.result() for f in results)
    else:
        outputs = (_runs(args.data_dir, t, s, policies, args.arrival) for t, s in pairs)
    for (trace, _), output in zip(pairs, outputs, strict=True):
        for label, pct, line in output:
            got.setdefault((trace, label), []).append(pct)
            print(line, flush=True)
    summary = []
    for trace in args.traces.split(","):
        for label in labels:
            xs = got[(trace, label)]
            sd = statistics.stdev(xs) if len(xs) > 1 else 0.0
            summary.append(
                f"{trace:<12} {label:<16} mean {statistics.mean(xs):6.2f} %  "
                f"min..max {min(xs):6.2f}..{max(xs):6.2f}  sd {sd:.2f}  (n={len(xs)})"
            )
    print(f"\nsummary (GPU allocation at {args.arrival:g} % arrivals):")
    print("\n".join(summary))
    print(
        f"load average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}; jobs {jobs}, cpus {os.cpu_count()}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
