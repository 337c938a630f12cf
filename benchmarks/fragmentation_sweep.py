"""The tuning sweep behind the `fragmentation` policy's defaults: variants of the learned workload's knobs
(text patches on the policy's source), each replayed by benchmarks/fragmentation_compare.py.

The patches are written against the source of commit 427c15f (the defaults before the sweep: the
64 most popular shapes, a prior of 64 pseudo-pods, popularity count / cards). Reproduce with

    git worktree add /tmp/src-427c15f 427c15f
    python benchmarks/fragmentation_sweep.py --source /tmp/src-427c15f --data-dir DIR \
        base@default@1,2,3,4,5 best@default@6,7,8,9,10 ...

Each argument is VARIANT[@TRACES[@SEEDS]] (default trace `default`, seeds 1-5); all run at once, each
with five processes, so give a machine with cores for them. Prints the summary lines per job and
writes every job's output to --out. Environment POLICIES (default `fragmentation`) picks the policies.
Results and the command lines are recorded in docs/benchmarks.md. Never run as a test.
"""

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

BASE = "hami/fragmentation.py"
V = {
    "base": [],
    "base_h0": [],
    "base_h1": [],
    "shapes128": [("max_shapes: int = 64,", "max_shapes: int = 128,")],
    "shapes32": [("max_shapes: int = 64,", "max_shapes: int = 32,")],
    "nodecay": [("half_life: float = 4000.0,", "half_life: float = 1e9,")],
    "hl1000": [("half_life: float = 4000.0,", "half_life: float = 1000.0,")],
    "hl16000": [("half_life: float = 4000.0,", "half_life: float = 16000.0,")],
    "drift02": [("drift: float = 0.05,", "drift: float = 0.02,")],
    "noprior": [("prior_weight: float = 64.0,", "prior_weight: float = 0.0,")],
    "check32": [("check_every: int = 128,", "check_every: int = 32,")],
    "wsqrt": [
        (
            "w = 1.0 / len(shapes) / max(s.cores / 100 * s.nums, 0.01)",
            "w = 1.0 / len(shapes) / max(s.cores / 100 * s.nums, 0.01) ** 0.5",
        )
    ],
    "w15": [
        (
            "w = 1.0 / len(shapes) / max(s.cores / 100 * s.nums, 0.01)",
            "w = 1.0 / len(shapes) / max(s.cores / 100 * s.nums, 0.01) ** 1.5",
        )
    ],
}
S32 = ("max_shapes: int = 64,", "max_shapes: int = 32,")
S24 = ("max_shapes: int = 64,", "max_shapes: int = 24,")
S16 = ("max_shapes: int = 64,", "max_shapes: int = 16,")
P0 = ("prior_weight: float = 64.0,", "prior_weight: float = 0.0,")
P8 = ("prior_weight: float = 64.0,", "prior_weight: float = 8.0,")
P16 = ("prior_weight: float = 64.0,", "prior_weight: float = 16.0,")
WA = "w = 1.0 / len(shapes) / max(s.cores / 100 * s.nums, 0.01)"
W15 = (WA, WA + " ** 1.5")
W2 = (WA, WA + " ** 2")
C32 = ("check_every: int = 128,", "check_every: int = 32,")
H1K = ("half_life: float = 4000.0,", "half_life: float = 1000.0,")
V.update(
    {
        "s16": [S16],
        "w2": [W2],
        "p8": [P8],
        "p16": [P16],
        "s32p8": [S32, P8],
        "s32p8w15": [S32, P8, W15],
        "s32p8w15c32": [S32, P8, W15, C32],
        "s24p8w15c32": [S24, P8, W15, C32],
        "s32p0w15c32": [S32, P0, W15, C32],
        "s32w15": [S32, W15],
        "s32p8w15c32h1k": [S32, P8, W15, C32, H1K],
        "s32p8w2c32": [S32, P8, W2, C32],
    }
)
W25 = (WA, WA + " ** 2.5")
W3 = (WA, WA + " ** 3")
W4 = (WA, WA + " ** 4")
V.update(
    {
        "w25": [W25],
        "w3": [W3],
        "w4": [W4],
        "s16p8w2c32": [S16, P8, W2, C32],
        "s24p8w2c32": [S24, P8, W2, C32],
        "s32p8w3c32": [S32, P8, W3, C32],
        "s32p16w2c32": [S32, P16, W2, C32],
        "s32p8w25c32": [S32, P8, W25, C32],
        "s16p8w3c32": [S16, P8, W3, C32],
        "s32w2": [S32, W2],
        "s32p8w2": [S32, P8, W2],
        "s24p8w3c32": [S24, P8, W3, C32],
    }
)
CS = "hami/cluster_scoring.py"
TIE = "out.append(((x, -n.current_score()), n.name, n))"
OBS = "            self.histogram.observe(s, w)"
BEST = [S32, P8, W2, C32]
V.update(
    {
        "best": BEST,
        "t01": BEST + [(TIE, TIE.replace("(x, -n", "(round(x, 2), -n"), CS)],
        "t05": BEST + [(TIE, TIE.replace("(x, -n", "(round(x * 20) / 20, -n"), CS)],
        "q1": BEST
        + [(OBS, "            self.histogram.observe(s._replace(cpu=-(-s.cpu // 1000) * 1000), w)")],
        "q4": BEST
        + [(OBS, "            self.histogram.observe(s._replace(cpu=-(-s.cpu // 4000) * 4000), w)")],
        "q0": BEST + [(OBS, "            self.histogram.observe(s._replace(cpu=0), w)")],
        "s48": [("max_shapes: int = 64,", "max_shapes: int = 48,"), P8, W2, C32],
        "s64": [P8, W2, C32],
    }
)
EN = "hami/simulate/engine.py"
MOST = (
    """        free = np.where(mask, free, -np.inf)
        return int(np.argmax(free))""",
    """        free = np.where(mask, free, np.inf)
        return int(np.argmin(free))""",
    EN,
)
DROP = (
    """        r, res = self.result, self.res
        r.pods += 1""",
    """        r, res = self.result, self.res
        if not pod.is_gpu:
            return
        r.pods += 1""",
    EN,
)
V["committed"] = [S32, P8, W2]  # the defaults kept (= s32p8w2)
V.update({"most": BEST + [MOST], "drop": BEST + [DROP], "most_base": [MOST], "drop_base": [DROP]})


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--source", type=Path, required=True, help="checkout whose hami/ and benchmarks/ are patched"
    )
    ap.add_argument("--data-dir", type=Path, required=True, help="the openb trace directory")
    ap.add_argument("--out", type=Path, default=Path("sweep-out"), help="directory for each job's output")
    ap.add_argument("jobs", nargs="+", metavar="VARIANT[@TRACES[@SEEDS]]")
    args = ap.parse_args()
    unknown = sorted({j.split("@")[0] for j in args.jobs} - set(V))
    if unknown:
        print(f"unknown variant(s) {', '.join(unknown)}; known: {', '.join(V)}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="fragmentation-sweep-"))
    procs = []
    for job in args.jobs:
        variant, *rest = job.split("@")
        traces = rest[0] if rest else "default"
        seeds = rest[1] if len(rest) > 1 else "1,2,3,4,5"
        name = "_".join([variant, traces.replace(",", "+"), seeds.replace(",", "")])
        d = work / name
        for part in ("hami", "benchmarks"):
            shutil.copytree(args.source / part, d / part)
        for a, b, *where in V[variant]:
            f = d / (where[0] if where else BASE)
            text = f.read_text()
            if a not in text:
                print(
                    f"{name}: the patch text {a!r} is not in {f.relative_to(d)} (wrong --source?)",
                    file=sys.stderr,
                )
                return 2
            f.write_text(text.replace(a, b))
        env = {**os.environ, "PYTHONPATH": str(d)}
        if variant.startswith("base_h"):  # the same code under another string-hash seed: determinism
            env["PYTHONHASHSEED"] = variant[-1]
        cmd = [
            sys.executable, "benchmarks/fragmentation_compare.py", "--data-dir", str(args.data_dir.resolve()),
            "--policies", os.environ.get("POLICIES", "fragmentation"), "--seeds", seeds, "--traces", traces,
            "--jobs", "5",
        ]  # fmt: skip
        out = (args.out / f"sweep_{name}.txt").open("w")
        procs.append((name, out, subprocess.Popen(cmd, cwd=d, env=env, stdout=out, stderr=subprocess.STDOUT)))
    for name, out, p in procs:
        p.wait()
        out.close()
        lines = (args.out / f"sweep_{name}.txt").read_text().splitlines()
        print(name, *[line for line in lines if "mean" in line], sep="\n  ")
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
