"""Summarise a py-spy raw (collapsed stacks) profile: where the samples under one frame went.

    py-spy record -r 200 -f raw -o prof.txt -- python benchmarks/scale_bench.py --samples 300
    python benchmarks/pyspy_summary.py prof.txt --under measure      # the filters
    python benchmarks/pyspy_summary.py prof.txt --under ClusterState.rebuild

Prints the share of the samples below a frame whose function name starts with `--under`: inclusive
per function, then self time per source line.
"""

from __future__ import annotations

import argparse
from collections import Counter


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("profile")
    ap.add_argument("--under", required=True, help="function name (e.g. 'measure', 'ClusterState.rebuild')")
    ap.add_argument("--top", type=int, default=20)
    a = ap.parse_args(argv)
    inclusive: Counter[str] = Counter()
    own: Counter[str] = Counter()
    total = 0
    with open(a.profile) as f:
        for line in f:
            stack, _, count = line.rstrip().rpartition(" ")
            frames = stack.split(";")
            if not any(fr.startswith(a.under + " ") for fr in frames):
                continue
            n = int(count)
            total += n
            for name in {fr.split(" (")[0] for fr in frames}:
                inclusive[name] += n
            own[frames[-1]] += n
    print(f"{total} samples under {a.under}")
    print("inclusive, by function:")
    for name, n in inclusive.most_common(a.top):
        print(f"  {100 * n / total:5.1f} %  {name}")
    print("self, by line:")
    for name, n in own.most_common(a.top):
        print(f"  {100 * n / total:5.1f} %  {name}")


if __name__ == "__main__":
    main()
