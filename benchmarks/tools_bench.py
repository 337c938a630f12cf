"""Time of `hami inspect` and `hami explain` on a generated large cluster, without the API round trips.

Generates `--nodes` nodes of 8 V100 32 GB cards (split 10) with `--pods-per-node` running pods each
(one card each, 4000-16000 MiB), plus pending pods that fail for different reasons, then times in
process: the snapshot build (`ClusterState.rebuild` + liveness), `inspect_cluster` + the table renderer,
and `explain_pod` for each pending pod (the real filter on every node, plus the trials that find what
would change the answer). The LIST calls themselves are not included (they are the API server's cost).

    python benchmarks/tools_bench.py [--nodes 1000] [--pods-per-node 6] [--repeat 3]

Prints the median seconds of each step; never part of the tests.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from hami.tools.explain import explain_pod  # noqa: E402
from hami.tools.inspect import inspect_cluster  # noqa: E402
from hami.tools.render import render_inspect  # noqa: E402
from hami.tools.snapshot import Listed, Snapshot  # noqa: E402
from hami.tools.table import Style  # noqa: E402
from kubefakes.demo_cluster import DEMO_NOW, V100, cards, limits, node, pod  # noqa: E402


def cluster(n_nodes: int, per_node: int) -> Listed:
    nodes, pods = [], []
    for i in range(n_nodes):
        name = f"node-{i:04d}"
        devs = cards(name, 8, 32768, V100)
        nodes.append(node(name, devs, now=DEMO_NOW))
        for j in range(per_node):
            mem = 4000 + 2000 * ((i + j) % 7)
            d = devs[j % 8]
            pods.append(
                pod("work", f"p-{i}-{j}", [("c", limits(1, mem, 10))], node=name, cards=[[(d.uuid, mem, 10)]])
            )
    pending = [
        pod("default", "too-big", [("main", limits(1, 40000, 10))]),
        pod("default", "whole", [("main", limits(1, None, None))]),
        pod("default", "nine", [("main", limits(9, 1000, 10))]),
        pod(
            "default", "a100", [("main", limits(1, 8000, 10))], annotations={"nvidia.com/use-gputype": "A100"}
        ),
    ]
    return Listed(nodes, pods + pending, [])


def timed(fn, repeat: int) -> tuple[float, object]:  # noqa: ANN001
    times, out = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--pods-per-node", type=int, default=6)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    listed = cluster(args.nodes, args.pods_per_node)
    print(f"{args.nodes} nodes, {args.nodes * 8} cards, {len(listed.pods)} pods")
    t, snap = timed(lambda: Snapshot.build(listed, now=DEMO_NOW), args.repeat)
    print(f"snapshot build        {t:8.3f} s")
    t, text = timed(lambda: render_inspect(inspect_cluster(snap), "wide", style=Style(False)), args.repeat)
    print(f"inspect -o wide       {t:8.3f} s  ({len(str(text).splitlines())} lines)")
    for name in ("too-big", "whole", "nine", "a100"):
        t, ex = timed(lambda name=name: explain_pod(snap, "default", name), args.repeat)
        print(f"explain {name:<13} {t:8.3f} s  ({len(ex.groups)} groups, {len(ex.suggestions)} suggestions)")
    t, ex = timed(lambda: explain_pod(snap, "work", "p-0-0"), args.repeat)
    print(f"explain scheduled     {t:8.3f} s  ({len(ex.runners_up)} other nodes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
