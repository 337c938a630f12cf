"""Benchmark: the cost of one fragmentation checkpoint of `hami simulate` (`hami.simulate.fragmeter`).

Builds a generated cluster of N nodes, fills its cards to about `--fill` percent of their compute with
openb-shaped pods (each pod filtered onto one random node that fits: the fill itself is not what is
measured), then times `FragmentationMeter.measure()`:

- cold: the first measurement (every node computed);
- warm: again with nothing changed (every node from the cache);
- checkpoint: after 10 % of the capacity more in pods (the nodes they landed on are computed again);
- new workload: after the learned workload changed (a fresh model: every node computed again, nodes in
  the same state sharing one computation).

With `--replay POLICY` it instead runs `hami simulate`'s fill replay to `--arrival` percent on the
generated cluster and workload and times every measurement the replay makes (the checkpoints at every
10 % of arrivals and the end), against the replay's own time.

Prints wall and process CPU seconds of each, the nodes, cards and the load average (the dev machine is
shared). Results and the command line are recorded in docs/benchmarks.md.

    python benchmarks/fragmeter_bench.py [--nodes 10000] [--fill 90] [--seed 1]
    python benchmarks/fragmeter_bench.py --replay binpack [--nodes 2000] [--arrival 130]
"""

from __future__ import annotations

import argparse
import os
import random
import time

from hami.cluster import ClusterState
from hami.config import DeviceConfig
from hami.fragmentation import FragmentationModel
from hami.simulate import fragmeter
from hami.simulate.engine import Mode, parse_policy, run
from hami.simulate.fragmeter import FragmentationMeter
from hami.simulate.generate import generate_nodes, generate_pods
from hami.simulate.workload import Workload


def timed(meter: FragmentationMeter) -> tuple[float, float, float]:
    w, c = time.perf_counter(), time.process_time()
    out = meter.measure()
    return time.perf_counter() - w, time.process_time() - c, out.fragmented


def fill(
    state: ClusterState, pods, names: list[str], rng: random.Random, cards: float, seq: list[int]
) -> int:
    """Filter pods onto random nodes until `cards` of demand were placed; returns the pods placed."""
    placed = 0
    done = 0.0
    tries = 0
    while done < cards and tries < 50 * len(names):
        tries += 1
        p = pods[rng.randrange(len(pods))]
        if p.gpu_demand <= 0:
            continue
        seq[0] += 1
        uid = f"b-{seq[0]}"
        obj = {**p.obj, "metadata": {**p.obj["metadata"], "uid": uid, "name": uid}}
        out = state.filter(obj, [names[rng.randrange(len(names))]], explain=False)
        if out.node is not None:
            done += p.gpu_demand
            placed += 1
    return placed


def replay(args: argparse.Namespace) -> None:
    """Time every measurement of one fill replay (wall and CPU), next to the replay's own time."""
    cfg = DeviceConfig()
    nodes = generate_nodes(args.nodes, config=cfg, seed=args.seed)
    capacity = sum(c.devcore for n in nodes for c in n.cards) / 100
    pods = generate_pods(max(20_000, 4 * args.nodes), config=cfg, gpu_capacity=capacity, seed=args.seed)
    workload = Workload(nodes=nodes, pods=pods, nodes_source="generated", pods_source="generated")
    measure = FragmentationMeter.measure
    took: list[tuple[float, float]] = []

    def timed_measure(self: FragmentationMeter) -> fragmeter.ClusterFragmentation:
        w, c = time.perf_counter(), time.process_time()
        out = measure(self)
        took.append((time.perf_counter() - w, time.process_time() - c))
        return out

    fragmeter.FragmentationMeter.measure = timed_measure  # type: ignore[method-assign]
    w, c = time.perf_counter(), time.process_time()
    r = run(
        workload,
        config=cfg,
        policy=parse_policy(args.replay),
        mode=Mode.FILL,
        arrival=args.arrival,
        seed=args.seed,
    )
    wall, cpu = time.perf_counter() - w, time.process_time() - c
    fragmeter.FragmentationMeter.measure = measure  # type: ignore[method-assign]
    print(f"nodes {len(nodes)}, cards {sum(len(n.cards) for n in nodes)}; {args.replay} fill to {args.arrival:g} %: "
          f"{r.pods} pods, GPU allocation {r.gpu_allocation_ratio * 100:.2f} %")  # fmt: skip
    print(f"replay wall {wall:.1f} s, cpu {cpu:.1f} s; {len(took)} measurements: wall {sum(x for x, _ in took):.2f} s "
          f"(max {max(x for x, _ in took):.3f} s), cpu {sum(y for _, y in took):.2f} s (max {max(y for _, y in took):.3f} s) "
          f"= {100 * sum(y for _, y in took) / cpu:.1f} % of the replay's CPU")  # fmt: skip
    print("cpu per measurement (s): " + " ".join(f"{y:.3f}" for _, y in took))
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=10_000)
    ap.add_argument("--fill", type=float, default=90.0, help="percent of the cards' compute to fill first")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--replay", metavar="POLICY", help="time the measurements of a fill replay instead")
    ap.add_argument("--arrival", type=float, default=130.0, help="with --replay: the fill target, percent")
    args = ap.parse_args()
    if args.replay:
        replay(args)
        return
    cfg = DeviceConfig()
    nodes = generate_nodes(args.nodes, config=cfg, seed=args.seed)
    capacity = sum(c.devcore for n in nodes for c in n.cards) / 100
    pods = generate_pods(5000, config=cfg, gpu_capacity=capacity, seed=args.seed)
    state = ClusterState(config=cfg)
    for n in nodes:
        state.upsert_node(n.obj)
    names = [n.name for n in nodes if n.cards]
    rng = random.Random(args.seed)
    seq = [0]
    t = time.perf_counter()
    placed = fill(state, pods, names, rng, capacity * args.fill / 100, seq)
    print(f"nodes {len(nodes)}, cards {sum(len(n.cards) for n in nodes)}, capacity {capacity:.0f} cards; "
          f"filled with {placed} pods in {time.perf_counter() - t:.1f} s")  # fmt: skip
    meter = FragmentationMeter(state)
    version = state.fragmentation.version
    rows = [("cold", *timed(meter)), ("warm", *timed(meter))]
    # Pods placed after the fill moves the learned workload; measure a checkpoint under the same
    # workload version when it did not move, else say so.
    more = fill(state, pods, names, rng, capacity * 0.10, seq)
    label = f"checkpoint (+{more} pods)" + (
        "" if state.fragmentation.version == version else ", workload changed"
    )
    rows.append((label, *timed(meter)))
    state.fragmentation = FragmentationModel()
    rows.append(("new workload", *timed(meter)))
    for label, wall, cpu, frag in rows:
        print(
            f"{label:<40} wall {wall * 1000:8.1f} ms  cpu {cpu * 1000:8.1f} ms  fragmented {frag:9.2f} cards"
        )
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")


if __name__ == "__main__":
    main()
