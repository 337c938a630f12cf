"""The compute limiter's targets on a real GPU, in one run (device machine, repository root):

    python3 benchmarks/libvgpu_limits.py --lib libvgpu/build/libvgpu.so [--hami PATH] [--seconds 6]

Tenants are separate processes with their own per-container region (separate containers) on one
card with a per-card region, each running libvgpu_tenant.py (bf16 matmul) over a window that starts
when all are warm. Shares are throughput over that of one process alone without the interceptor
(measured in the same run), together with an unlimited pair as the reference for what two
time-sliced contexts get. Then: the controller alone at 10..90 % (mean absolute error after the
first second, and the first step's latency), 15 chained 200 ms processes of one container at 20 %,
launch overhead (launch_bench.cu, interleaved pairs), cuMemAlloc/cuMemFree pairs (alloc_bench.c),
and 64 processes starting at once (each its own container), and a tenant beside a sparse neighbour
(a tiny kernel every 50 ms). Prints JSON lines (also to $OUT/limits.jsonl) and a summary.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
TENANT = HERE / "libvgpu_tenant.py"
OUT = Path(os.environ.get("OUT", "/tmp/libvgpu-out"))
LOG = OUT / "limits.jsonl"


def emit(rec: dict) -> dict:
    line = json.dumps(rec)
    print(line, flush=True)
    with LOG.open("a") as f:
        f.write(line + "\n")
    return rec


class Run:
    def __init__(self, lib: str, work: Path, seconds: float):
        self.lib, self.work, self.seconds = lib, work, seconds
        self.cards = work / "cards"
        self.cards.mkdir()
        self.uuid = subprocess.run(["nvidia-smi", "--query-gpu=uuid", "--format=csv,noheader"], capture_output=True,
                                   text=True).stdout.split()[0]  # fmt: skip
        self.n = 0

    def env(self, sm, cache: str, lib: str | None = "ours", card: bool = True) -> dict:
        e = dict(os.environ, CUDA_DEVICE_MEMORY_LIMIT="30000m", CUDA_DEVICE_MEMORY_SHARED_CACHE=str(self.work / cache),
                 PYTHONUNBUFFERED="1")  # fmt: skip
        if lib == "ours":
            e["LD_PRELOAD"] = self.lib
            if sm is not None:
                e["CUDA_DEVICE_SM_LIMIT"] = str(sm)
            if card:
                e["LIBVGPU_CARD_DIR"] = str(self.cards)
        return e

    def group(self, label: str, specs: list[dict], seconds: float | None = None) -> list[dict]:
        """specs: {sm, lib ('ours'|'none'), streams, cache}; all start their window together."""
        (self.cards / f"{self.uuid}.card").unlink(missing_ok=True)
        (self.cards / f"{self.uuid}.card").touch()
        sync = self.work / f"sync{self.n}"
        self.n += 1
        sync.mkdir()
        procs = []
        for i, sp in enumerate(specs):
            cache = sp.get("cache", f"{label}.{i}.cache")
            cmd = [sys.executable, str(TENANT), "--ready", str(sync / f"r{i}"), "--go", str(sync / "go"),
                   "--seconds", str(seconds or self.seconds), "--label", f"{label}.{i}", "--streams", str(sp.get("streams", 1)),
                   "--sparse-ms", str(sp.get("sparse_ms", 0))]  # fmt: skip
            procs.append(subprocess.Popen(cmd, env={**self.env(sp.get("sm"), cache, sp.get("lib", "ours")), **sp.get("env", {})},
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))  # fmt: skip
        deadline = time.monotonic() + 120
        while sum((sync / f"r{i}").exists() for i in range(len(specs))) < len(specs) and time.monotonic() < deadline:
            time.sleep(0.02)
        (sync / "go").touch()
        res = []
        for sp, p in zip(specs, procs, strict=True):
            out, err = communicate(p, 180)
            lines = [json.loads(ln) for ln in out.splitlines() if ln.startswith("{")]
            rec = lines[-1] if lines else {"failed": p.returncode, "stderr": err[-400:]}
            res.append(emit({"group": label, "spec": sp, **rec}))
        return res

    def chain(self, label: str, count: int, sm: int, seconds: float) -> dict:
        """`count` processes of one container, each `seconds` of work, each starting when the one
        before it exited (all warm beforehand)."""
        (self.cards / f"{self.uuid}.card").unlink(missing_ok=True)
        (self.cards / f"{self.uuid}.card").touch()
        sync = self.work / f"chain{self.n}"
        self.n += 1
        sync.mkdir()
        procs = []
        for i in range(count):
            cmd = [sys.executable, str(TENANT), "--ready", str(sync / f"r{i}"), "--go", str(sync / f"go{i}"),
                   "--seconds", str(seconds), "--label", f"{label}.{i}"]  # fmt: skip
            procs.append(subprocess.Popen(cmd, env=self.env(sm, f"{label}.cache"), stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE, text=True))  # fmt: skip
        deadline = time.monotonic() + 180
        while sum((sync / f"r{i}").exists() for i in range(count)) < count and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(3.0)  # let the warm-ups' pause run out
        recs = []
        for i, p in enumerate(procs):
            (sync / f"go{i}").touch()
            out, err = communicate(p, 60)
            lines = [json.loads(ln) for ln in out.splitlines() if ln.startswith("{")]
            recs.append(lines[-1] if lines else {"failed": p.returncode, "stderr": err[-400:]})
        ok = [r for r in recs if "t0" in r]
        work = sum(r["tflops"] * r["seconds"] for r in ok)
        span = max(r["t1"] for r in ok) - min(r["t0"] for r in ok) if ok else 0
        return emit({"group": label, "count": count, "sm": sm, "seconds_each": seconds, "ok": len(ok),
                     "span_s": round(span, 3), "tflops_over_span": round(work / span, 1) if span else None,
                     "per_process_tflops": [r.get("tflops") for r in recs]})  # fmt: skip


def communicate(p: subprocess.Popen, timeout: float) -> tuple[str, str]:
    """The process's output, or a failure note when it outlived `timeout` seconds (then killed)."""
    try:
        return p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        out, err = p.communicate()
        return out, f"{err}\ntimed out after {timeout} s"


def c_bench(cmd: list[str], env: dict) -> dict:
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    lines = [json.loads(ln) for ln in p.stdout.splitlines() if ln.startswith("{")]
    return lines[-1] if lines else {"failed": p.returncode, "stderr": p.stderr[-300:]}


def storm(probe: str, procs: int, env: dict, work: Path, tag: str) -> dict:
    """`procs` processes start at once (cuInit to the first allocation), each a container of its own
    (its own per-container region file)."""
    go = work / f"go.{tag}"
    ps = [subprocess.Popen([probe, str(go)], env={**env, "CUDA_DEVICE_MEMORY_SHARED_CACHE": str(work / f"st.{tag}.{i}.cache")},
                           stdout=subprocess.PIPE, text=True) for i in range(procs)]  # fmt: skip
    time.sleep(2.0)
    t_go = time.monotonic()
    go.touch()
    done = []
    for p in ps:
        out, _ = p.communicate(timeout=120)
        recs = [json.loads(ln) for ln in out.splitlines() if ln.startswith("{")]
        if recs and recs[-1]["rc"] == 0:
            done.append(recs[-1]["t1"] - t_go)
    done.sort()
    return {"ok": len(done), "p50_s": round(statistics.median(done), 4) if done else None,
            "max_s": round(done[-1], 4) if done else None}  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lib", required=True)
    ap.add_argument("--hami", default="", help="HAMi-core's libvgpu.so, for the overhead comparison")
    ap.add_argument("--old", default="", help="an earlier libvgpu.so: the chain is run with it too")
    ap.add_argument("--seconds", type=float, default=6.0)
    ap.add_argument("--pairs", type=int, default=20)
    ap.add_argument("--only", default="", help="comma list of parts: sparse,shares,shares2,accuracy,chain,overhead,start")
    ap.add_argument("--launches", type=int, default=200000, help="empty kernels per launch_bench run")
    ap.add_argument("--launch-libs", default="none,ours,hami", help="which libraries the launch pairs interleave")
    ap.add_argument("--storm-runs", type=int, default=2, help="64-process start-ups per library")
    a = ap.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    lib = str(Path(a.lib).resolve())
    parts = set(a.only.split(",")) if a.only else {"sparse", "shares", "accuracy", "chain", "overhead", "start"}
    summary = {}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        r = Run(lib, work, a.seconds)
        base = 0.0
        if parts & {"shares", "shares2", "sparse", "accuracy", "chain"}:
            base = r.group("alone-none", [{"lib": "none"}])[0]["tflops"]
            summary["alone_none_tflops"] = base

        def share(rec):
            return round(100 * rec.get("tflops", 0) / base, 1)

        if "sparse" in parts:  # a limited tenant beside a tiny kernel every 50 ms (itself at 50 %)
            for sm in (50, 25):
                x = r.group(f"{sm}-beside-sparse", [{"sm": sm}, {"sm": 50, "sparse_ms": 50}])
                summary[f"{sm}_beside_sparse"] = [share(v) for v in x]
        if "shares" in parts:
            ref = r.group("pair-none", [{"lib": "none"}, {"lib": "none"}])
            summary["unlimited_pair"] = [share(x) for x in ref]
            x = r.group("50-beside-unlimited", [{"sm": 50}, {"sm": None}])
            summary["50_beside_unlimited"] = [share(v) for v in x]
            x = r.group("25-75", [{"sm": 25}, {"sm": 75}])
            summary["25_75"] = [share(v) for v in x]
            x = r.group("4x25", [{"sm": 25}] * 4)
            summary["4x25"] = [share(v) for v in x]
            x = r.group("50-4streams-vs-50-1stream", [{"sm": 50, "streams": 4}, {"sm": 50}])
            summary["50_4streams_vs_1stream"] = [share(v) for v in x]
        if "unlimited_pair" in summary:  # shares of what two time-sliced contexts get together
            pair = sum(summary["unlimited_pair"])
            for key in ("25_75", "50_4streams_vs_1stream", "4x25", "50_beside_unlimited"):
                if key in summary:
                    summary[f"{key}_of_pair_total"] = [round(100 * v / pair, 1) for v in summary[key]]
        if "shares2" in parts:  # a second sample of the groups nearest their bounds
            for label, specs, key in (("25-75-b", [{"sm": 25}, {"sm": 75}], "25_75_b"),
                                      ("50-4streams-vs-50-1stream-b", [{"sm": 50, "streams": 4}, {"sm": 50}], "50_4streams_vs_1stream_b"),
                                      ("50-beside-sparse-b", [{"sm": 50}, {"sm": 50, "sparse_ms": 50}], "50_beside_sparse_b"),
                                      ("50-beside-unlimited-b", [{"sm": 50}, {"sm": None}], "50_beside_unlimited_b")):  # fmt: skip
                summary[key] = [share(v) for v in r.group(label, specs)]
        if "accuracy" in parts:
            acc = {}
            for sm in (10, 20, 30, 50, 70, 90):
                (v,) = r.group(f"alone-{sm}", [{"sm": sm}])
                late = v.get("tflops_after_1s") or 0
                acc[sm] = {"share_after_1s": round(100 * late / base, 1), "first_step_s": v.get("first_step_s")}
            summary["alone"] = acc
            summary["alone_mae_after_1s"] = round(statistics.mean(abs(v["share_after_1s"] - sm) for sm, v in acc.items()), 2)
        if "chain" in parts:
            c = r.chain("chain-15x200ms-at-20", 15, 20, 0.2)
            summary["chain_15x200ms_at_20"] = round(100 * (c["tflops_over_span"] or 0) / base, 1)
            if a.old:
                r.lib = str(Path(a.old).resolve())
                c = r.chain("chain-15x200ms-at-20-old", 15, 20, 0.2)
                summary["chain_15x200ms_at_20_old_lib"] = round(100 * (c["tflops_over_span"] or 0) / base, 1)
                r.lib = lib
        if "overhead" in parts:
            cuda = os.environ.get("CUDA_HOME", "/usr/local/cuda")
            bench = Path(os.environ.get("BENCH", HERE.parent / ".devcarry/bench/gpu"))
            subprocess.run(["nvcc", "-O2", str(bench / "launch_bench.cu"), "-o", str(work / "lb")], check=True)
            subprocess.run(["cc", "-O2", str(bench / "alloc_bench.c"), f"-I{cuda}/include", f"-L{cuda}/lib64/stubs",
                            f"-L{cuda}/lib64", "-lcuda", "-o", str(work / "ab")], check=True)  # fmt: skip
            libs = {"none": None, "ours": lib}
            if a.hami:
                libs["hami"] = str(Path(a.hami).resolve())
            launch_libs = {k: v for k, v in libs.items() if k in a.launch_libs.split(",")}
            launch = {k: [] for k in launch_libs}
            for i in range(a.pairs):
                for name, so in launch_libs.items():
                    env = dict(os.environ, CUDA_DEVICE_MEMORY_SHARED_CACHE=str(work / f"lb.{name}.cache"))
                    if so:
                        env["LD_PRELOAD"] = so
                    rec = emit({"bench": "launch", "lib": name, "pair": i, **c_bench([str(work / "lb"), str(a.launches)], env)})
                    launch[name].append(rec.get("launch_ns"))
            for name in launch_libs:
                if name != "none" and all(launch[name]) and all(launch["none"]):
                    d = [x - y for x, y in zip(launch[name], launch["none"], strict=True)]
                    summary[f"launch_{name}_minus_none_median_ns"] = round(statistics.median(d), 1)
            summary["launch_median_ns"] = {k: round(statistics.median([x for x in v if x]), 1) for k, v in launch.items() if any(v)}
            alloc = {k: [] for k in libs}
            for i in range(3):
                for name, so in libs.items():
                    # both spellings of the limit, so HAMi-core's is in force too (total_mib shows it: 8000)
                    env = dict(os.environ, CUDA_DEVICE_MEMORY_SHARED_CACHE=str(work / f"ab.{name}.{i}.cache"),
                               CUDA_DEVICE_MEMORY_LIMIT="8000m", CUDA_DEVICE_MEMORY_LIMIT_0="8000m")  # fmt: skip
                    if so:
                        env["LD_PRELOAD"] = so
                    rec = emit({"bench": "alloc", "lib": name, "run": i, **c_bench([str(work / "ab"), "20000"], env)})
                    alloc[name].append(rec.get("alloc_free_ns"))
                    summary.setdefault("alloc_total_mib_seen", {})[name] = rec.get("total_mib")
            summary["alloc_free_median_ns"] = {k: round(statistics.median([x for x in v if x]), 1) for k, v in alloc.items() if any(v)}
            if "hami" in libs:  # HAMi-core's own log of one short run: does it apply the limit?
                env = dict(os.environ, CUDA_DEVICE_MEMORY_SHARED_CACHE=str(work / "ab.hami.log.cache"), LIBCUDA_LOG_LEVEL="4",
                           CUDA_DEVICE_MEMORY_LIMIT="8000m", CUDA_DEVICE_MEMORY_LIMIT_0="8000m", LD_PRELOAD=libs["hami"])  # fmt: skip
                p = subprocess.run([str(work / "ab"), "200"], env=env, capture_output=True, text=True, timeout=60)
                (OUT / "hami_alloc_log.txt").write_text(p.stdout + p.stderr[-6000:])
        if "start" in parts:
            cuda = os.environ.get("CUDA_HOME", "/usr/local/cuda")
            probe = work / "sp"
            subprocess.run(["cc", "-O2", str(HERE / "libvgpu_start_probe.c"), f"-I{cuda}/include",
                            f"-L{cuda}/lib64/stubs", f"-L{cuda}/lib64", "-lcuda", "-o", str(probe)], check=True)  # fmt: skip
            st = {}
            for i in range(a.storm_runs):
                for name in ("none", "ours"):
                    env = dict(os.environ, CUDA_DEVICE_MEMORY_SHARED_CACHE=str(work / f"st.{name}.{i}.cache"),
                               CUDA_DEVICE_MEMORY_LIMIT="60000m")  # 64 contexts of ~520 MiB fit  # fmt: skip
                    if name == "ours":
                        env["LD_PRELOAD"] = lib
                    rec = emit({"bench": "start64", "lib": name, "run": i, **storm(str(probe), 64, env, work, f"{name}{i}")})
                    st.setdefault(name, []).append(rec["p50_s"])
            summary["start64_p50_s"] = st
    emit({"summary": summary})
    return 0


if __name__ == "__main__":
    sys.exit(main())
