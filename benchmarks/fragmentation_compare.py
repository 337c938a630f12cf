"""Placement quality of every policy on the Alibaba v2023 openb traces: GPU allocation at a fill target.

For each trace (pod list) and each seed, replays the same pod stream (fill mode, drawn with replacement
until the arrived GPU demand reaches `--arrival` percent of the 6212 GPUs) under each policy and prints
one line per run, then per trace and policy the mean, the spread (min..max) and the standard deviation
over the seeds. Same replay as `hami simulate --compare ...` (hami.simulate.engine.run).

    python benchmarks/fragmentation_compare.py [--data-dir DIR] [--traces default,gpushare40,...]
        [--policies binpack,spread,spread/binpack,fragmentation] [--seeds 1,2,3,4,5] [--arrival 130]

Results and the command line are recorded in docs/benchmarks.md. Never run as a test.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from hami.config import DeviceConfig
from hami.simulate import openb
from hami.simulate.engine import Mode, parse_policy, run
from hami.simulate.workload import Workload

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "alibaba-gpu-v2023"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data-dir", type=Path, default=DATA)
    ap.add_argument("--traces", default="default")
    ap.add_argument("--policies", default="binpack,spread,spread/binpack,fragmentation")
    ap.add_argument("--seeds", default="1,2,3,4,5")
    ap.add_argument("--arrival", type=float, default=130.0)
    args = ap.parse_args()
    cfg = DeviceConfig()
    nodes_csv = args.data_dir / "openb_node_list_gpu_node.csv"
    if not nodes_csv.exists():
        print(f"no trace at {args.data_dir} (give --data-dir)", file=sys.stderr)
        return 2
    policies = [parse_policy(p) for p in args.policies.split(",")]
    seeds = [int(s) for s in args.seeds.split(",")]
    summary = []
    for trace in args.traces.split(","):
        pods_csv = args.data_dir / f"openb_pod_list_{trace}.csv"
        workload = Workload(openb.load_nodes(nodes_csv, config=cfg), openb.load_pods(pods_csv, config=cfg))
        got: dict[str, list[float]] = {p.label: [] for p in policies}
        for seed in seeds:
            for policy in policies:
                t0 = time.perf_counter()
                r = run(workload, config=cfg, policy=policy, mode=Mode.FILL, arrival=args.arrival, seed=seed)
                got[policy.label].append(r.gpu_allocation_ratio * 100)
                print(
                    f"{trace:<12} seed {seed}  {policy.label:<16} GPU alloc {r.gpu_allocation_ratio * 100:6.2f} %  "
                    f"failed {r.failed:5d}  p50/p99 {r.decision_percentile_ms(50):.2f}/"
                    f"{r.decision_percentile_ms(99):.2f} ms  {time.perf_counter() - t0:5.1f} s",
                    flush=True,
                )
        for label, xs in got.items():
            sd = statistics.stdev(xs) if len(xs) > 1 else 0.0
            summary.append(f"{trace:<12} {label:<16} mean {statistics.mean(xs):6.2f} %  "
                           f"min..max {min(xs):6.2f}..{max(xs):6.2f}  sd {sd:.2f}  (n={len(xs)})")
    print("\nsummary (GPU allocation at %g %% arrivals):" % args.arrival)
    print("\n".join(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
