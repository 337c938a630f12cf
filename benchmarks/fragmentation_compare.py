"""Placement quality of every policy on the Alibaba v2023 openb traces: allocation and pods placed at a
fill target.

For each trace (pod list), workload (`--restate`: the trace's own mapping `openb`, or the trace restated
as HAMi users write requests, `hami.simulate.restate`) and seed, replays the same pod stream (fill mode,
drawn with replacement until the arrived GPU demand reaches `--arrival` percent of the 6212 GPUs) under
each policy and prints one line per run (capacity taken, cores, memory, pods scheduled and failed, the
failed GPU demand), then per trace, workload and policy the means and ranges over the seeds. Same
replay as `hami simulate --compare ...` (hami.simulate.engine.run).

    python benchmarks/fragmentation_compare.py [--data-dir DIR] [--traces default,gpushare40,...]
        [--restate openb,hami,gpumem] [--policies binpack,spread,spread/binpack,fragmentation]
        [--seeds 1,2,3,4,5] [--arrival 130]
        [--jobs N]   # replays in N processes at once; lines come out in the same order

A policy may carry knobs of the fragmentation policy for its run, `fragmentation@cpu_weight=0`
(`KNOBS`), to compare variants on the same streams.

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

from hami import fragmentation
from hami.cluster import ClusterState
from hami.config import DeviceConfig
from hami.simulate import openb
from hami.simulate.engine import Mode, parse_policy, run
from hami.simulate.restate import restate
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


#: Knobs of the fragmentation policy a policy spec may set for its run: `fragmentation@cpu_weight=0`.
KNOBS = {
    "cpu_weight": lambda v: fragmentation.FragmentationModel.__init__.__kwdefaults__.__setitem__(
        "cpu_weight", v
    ),
    "max_shapes": lambda v: fragmentation.FragmentationModel.__init__.__kwdefaults__.__setitem__(
        "max_shapes", int(v)
    ),
    "exponent": lambda v: setattr(fragmentation, "DEMAND_EXPONENT", v),
}


def _knobs(spec: str) -> tuple[str, list[tuple[str, float]]]:
    """(policy, [(knob, value)]) of ``POLICY[@KNOB=VALUE...]``."""
    policy, *rest = spec.split("@")
    knobs = []
    for kv in rest:
        k, _, v = kv.partition("=")
        if k not in KNOBS:
            raise SystemExit(f"unknown knob {k!r} in {spec!r}; known: {', '.join(KNOBS)}")
        knobs.append((k, float(v)))
    return policy, knobs


def _label(spec: str) -> str:
    policy, knobs = _knobs(spec)
    return parse_policy(policy).label + "".join(f"[{k}={v:g}]" for k, v in knobs)


def _run(data_dir: Path, trace: str, restated: str, seed: int, spec: str, arrival: float) -> dict:
    """One replay: the figures of `spec` (a policy, with knobs) on one (trace, restatement, seed)."""
    cfg = DeviceConfig()
    nodes = openb.load_nodes(data_dir / "openb_node_list_gpu_node.csv", config=cfg)
    pods = openb.load_pods(data_dir / f"openb_pod_list_{trace}.csv", config=cfg)
    if restated != "openb":
        pods = restate(pods, nodes, restated, config=cfg, seed=seed)
    policy, knobs = _knobs(spec)
    saved = (dict(fragmentation.FragmentationModel.__init__.__kwdefaults__), fragmentation.DEMAND_EXPONENT)
    for k, v in knobs:
        KNOBS[k](v)
    try:
        t0 = time.perf_counter()
        _CPU_S.clear()
        r = run(Workload(nodes, pods), config=cfg, policy=parse_policy(policy), mode=Mode.FILL, arrival=arrival,
                seed=seed)  # fmt: skip
    finally:
        fragmentation.FragmentationModel.__init__.__kwdefaults__.update(saved[0])
        fragmentation.DEMAND_EXPONENT = saved[1]
    line = (
        f"{trace:<12} {restated:<17} seed {seed:<2} {_label(spec):<32} capacity {r.capacity_allocation_ratio * 100:6.2f} %  "
        f"cores {r.gpu_allocation_ratio * 100:6.2f} %  memory {r.memory_allocation_ratio * 100:6.2f} %  "
        f"scheduled {r.scheduled:5d}  failed {r.failed:5d}  failed demand {r.failed_gpu_demand:7.1f} cards  "
        f"p50/p99 {r.decision_percentile_ms(50):.2f}/{r.decision_percentile_ms(99):.2f} ms  "
        f"cpu p50/p99 {_percentile_ms(_CPU_S, 50):.2f}/{_percentile_ms(_CPU_S, 99):.2f} ms  "
        f"{time.perf_counter() - t0:5.1f} s"
    )
    return {
        "capacity": r.capacity_allocation_ratio * 100,
        "cores": r.gpu_allocation_ratio * 100,
        "scheduled": r.scheduled,
        "failed_demand": r.failed_gpu_demand,
        "line": line,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data-dir", type=Path, default=DATA)
    ap.add_argument("--traces", default="default")
    ap.add_argument(
        "--restate",
        default="openb",
        help="comma list of workloads: openb (the trace's own mapping) and hami.simulate.restate variants",
    )
    ap.add_argument("--policies", default="binpack,spread,spread/binpack,fragmentation",
                    help="comma list of POLICY[@KNOB=VALUE...]; knobs: " + ", ".join(KNOBS))  # fmt: skip
    ap.add_argument("--seeds", default="1,2,3,4,5")
    ap.add_argument("--arrival", type=float, default=130.0)
    ap.add_argument("--jobs", type=int, default=1, help="replays run at once (processes)")
    args = ap.parse_args()
    if not (args.data_dir / "openb_node_list_gpu_node.csv").exists():
        print(f"no trace at {args.data_dir} (give --data-dir)", file=sys.stderr)
        return 2
    specs = args.policies.split(",")
    labels = [_label(p) for p in specs]
    seeds = [int(s) for s in args.seeds.split(",")]
    loads = [(t, w) for t in args.traces.split(",") for w in args.restate.split(",")]
    jobs_list = [(t, w, s, p) for t, w in loads for s in seeds for p in specs]
    got: dict[tuple[str, str, str], list[dict]] = {}
    jobs = max(1, args.jobs)
    if jobs > 1:
        pool = ProcessPoolExecutor(jobs)
        futures = [pool.submit(_run, args.data_dir, t, w, s, p, args.arrival) for t, w, s, p in jobs_list]
        outputs = (f.result() for f in futures)
    else:
        outputs = (_run(args.data_dir, t, w, s, p, args.arrival) for t, w, s, p in jobs_list)
    for (trace, restated, _, spec), out in zip(jobs_list, outputs, strict=True):
        got.setdefault((trace, restated, _label(spec)), []).append(out)
        print(out["line"], flush=True)
    print(
        f"\nsummary (fill to {args.arrival:g} % arrivals; capacity: per card the largest of cores, memory, slots):"
    )
    for trace, restated in loads:
        for label in labels:
            xs = got[(trace, restated, label)]
            cap = [x["capacity"] for x in xs]
            cores = [x["cores"] for x in xs]
            pods = [x["scheduled"] for x in xs]
            sd = statistics.stdev(cap) if len(cap) > 1 else 0.0
            print(
                f"{trace:<12} {restated:<17} {label:<32} capacity mean {statistics.mean(cap):6.2f} % "
                f"(min..max {min(cap):6.2f}..{max(cap):6.2f}, sd {sd:.2f})  cores mean {statistics.mean(cores):6.2f} %  "
                f"scheduled mean {statistics.mean(pods):7.1f} (min..max {min(pods)}..{max(pods)})  (n={len(xs)})"
            )
    print(
        f"load average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}; jobs {jobs}, cpus {os.cpu_count()}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
