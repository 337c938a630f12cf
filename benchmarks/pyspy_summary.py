"""Summarise a py-spy raw profile (``py-spy record --format raw``): share of samples per thread root,
per function (self) and per function on the stack (inclusive), file paths shortened.

    py-spy record --pid PID --gil --format raw -o prof.txt --duration 30 --rate 100 --nonblocking
    python benchmarks/pyspy_summary.py prof.txt [--top 40] [--exclude generate_latest]

`--exclude NAME`: leave out the samples whose stack contains a function of that name (e.g. the
benchmark's own /metrics scrapes) before the shares are computed. Never part of the tests.
"""

from __future__ import annotations

import argparse
import collections
import re

FRAME = re.compile(r" \((?:.*/)?((?:site-packages/)?[^/]+/[^/]+\.py|[^/()]+):\d+\)$")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("raw")
    p.add_argument("--top", type=int, default=40)
    p.add_argument("--exclude", action="append", default=[])
    args = p.parse_args()
    total = excluded = 0
    roots: collections.Counter[str] = collections.Counter()
    own: collections.Counter[str] = collections.Counter()
    incl: collections.Counter[str] = collections.Counter()
    with open(args.raw) as f:
        for line in f:
            stack, _, count = line.rstrip("\n").rpartition(" ")
            if not stack:
                continue
            n = int(count)
            frames = [FRAME.sub(r" (\1)", fr) for fr in stack.split(";")]
            if any(fr.split(" (")[0].endswith(tuple(args.exclude)) for fr in frames) and args.exclude:
                excluded += n
                continue
            total += n
            roots[frames[0]] += n
            own[frames[-1]] += n
            for fr in set(frames):
                incl[fr] += n
    print(f"samples: {total} counted, {excluded} excluded ({', '.join(args.exclude) or 'none'})")
    for title, counter in (("thread roots", roots), ("self", own), ("inclusive", incl)):
        print(f"--- {title}")
        for name, n in counter.most_common(args.top):
            print(f"{100 * n / total:5.1f}%  {name}")


if __name__ == "__main__":
    main()
