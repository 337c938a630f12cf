"""Repeats the 30/30/40 card scenario of test_card.py, optionally beside CPU hogs, and counts the
runs whose shares leave the test's bounds (a flakiness check, not collected by pytest).

    python -m tests.libvgpu.card_repeat --runs 30 --hogs 2

Each hog is a `python -c "while True: pass"` process, started before the first run and killed
after the last, so the tenants compete with it for the machine's cores. Prints one line per run
(the three shares, as `fed_share` takes them) and a final `violations N of RUNS` line; exits 1
when any run left the bounds. Needs what the tests need: gcc, make and cuda.h (CUDA_HOME).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

from .conftest import BUILD, LIBVGPU, Cli
from .test_card import TOGETHER_30_30_40, UUID0, WITHIN_30_30_40, tenants


def one_run(tmp: Path) -> list[float]:
    """Shares of the 30/30/40 tenants in one run, in a fresh directory under `tmp`."""
    cli = Cli(BUILD, Path(tempfile.mkdtemp(prefix="run", dir=tmp)))
    card_dir = cli.tmp / "cards"
    card_dir.mkdir()
    (card_dir / f"{UUID0}.card").touch()
    return tenants(cli, card_dir, [(30, 1), (30, 1), (40, 1)], ms=4000)


def within(shares: list[float]) -> bool:
    """True when the shares meet every bound test_three_tenants_30_30_40 asserts."""
    inside = all(lo <= s <= hi for s, (lo, hi) in zip(shares, WITHIN_30_30_40, strict=True))
    return inside and sum(shares) >= TOGETHER_30_30_40


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=30, help="repetitions (default 30)")
    ap.add_argument("--hogs", type=int, default=0, help="CPU busy loops beside the tenants (default 0)")
    args = ap.parse_args(argv)
    if args.runs < 1 or args.hogs < 0:
        ap.error("--runs must be >= 1 and --hogs >= 0")
    r = subprocess.run(["make", "-s", "-C", str(LIBVGPU), "test-bins"], capture_output=True, text=True)
    if r.returncode != 0:
        print(f"make -C libvgpu test-bins failed:\n{r.stdout}{r.stderr}", file=sys.stderr)
        return 2
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.hogs)]
    violations = 0
    try:
        with tempfile.TemporaryDirectory(prefix="card_repeat") as tmp:
            for i in range(args.runs):
                shares = one_run(Path(tmp))
                ok = within(shares)
                violations += not ok
                print(
                    f"run {i + 1:3d} {'ok  ' if ok else 'OUT '} " + " ".join(f"{s:.3f}" for s in shares),
                    flush=True,
                )
    finally:
        for h in hogs:
            h.kill()
            h.wait()
    print(f"violations {violations} of {args.runs} (hogs {args.hogs})")
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
