"""Admission reviews per second and latency of the webhook over TLS, from concurrent clients.

Starts `python -m webhook` as a separate process with a throwaway CA (as the API server would call
it: HTTPS, chain verified), then drives it with `--concurrency` keep-alive clients (the API server
reuses connections) posting the AdmissionReview of a typical GPU pod (tests/golden/webhook/<case>),
and prints reviews/s with p50/p90/p99/max client-observed latency. `--new-connections` makes every
request a fresh TLS handshake (the worst case, e.g. right after a certificate rotation).

    python benchmarks/webhook_bench.py [--requests 20000] [--concurrency 16] [--case gpumem-gi-to-mib]

Targets (issue 4): >= 1000 reviews/s and p99 <= 5 ms on the 2-core development machine.
Prints figures; never part of the tests.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from webhook.devcerts import make_ca, make_server_cert, write_pair  # noqa: E402


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (Linux /proc), to report the server's cost per review."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def start_server(tmp: Path, extra: list[str]) -> tuple[subprocess.Popen, int, ssl.SSLContext]:
    ca = make_ca()
    cert, key = write_pair(tmp, *make_server_cert(ca))
    proc = subprocess.Popen(
        [sys.executable, "-m", "webhook", "--tls-cert-file", str(cert), "--tls-private-key-file", str(key),
         "--address", "127.0.0.1", "--port", "0", "--log-level", "INFO", *extra],
        cwd=ROOT, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stderr is not None
    for line in proc.stderr:
        m = re.search(r"serving on https://127\.0\.0\.1:(\d+)", line)
        if m:
            ctx = ssl.create_default_context(cadata=ca.cert_pem.decode())
            return proc, int(m.group(1)), ctx
    raise SystemExit(f"webhook did not start (exit {proc.wait()})")


async def drive(
    url: str, body: bytes, ctx: ssl.SSLContext, *, requests: int, concurrency: int, fresh: bool, pid: int
) -> tuple[float, list[float], float]:
    latencies: list[float] = []
    remaining = requests
    connector = aiohttp.TCPConnector(ssl=ctx, limit=concurrency, force_close=fresh)
    headers = {"Content-Type": "application/json"}
    async with aiohttp.ClientSession(connector=connector) as session:

        async def worker() -> None:
            nonlocal remaining
            while remaining > 0:
                remaining -= 1
                t0 = time.perf_counter()
                async with session.post(url, data=body, headers=headers) as resp:
                    payload = await resp.read()
                    if resp.status != 200:
                        raise SystemExit(f"HTTP {resp.status}: {payload[:200]!r}")
                latencies.append(time.perf_counter() - t0)

        # Warm up connections and code paths before timing.
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        latencies.clear()
        remaining = requests
        cpu0 = cpu_seconds(pid)
        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.perf_counter() - started
        cpu = cpu_seconds(pid) - cpu0
        async with session.get(url.split("/mutate")[0] + "/metrics") as resp:
            metrics = await resp.text()
    return elapsed, latencies, cpu, metrics


WRK_SCRIPT = """
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
local f = io.open("{body}", "rb")
wrk.body = f:read("*a")
f:close()
"""
_UNITS = {"us": 0.001, "ms": 1.0, "s": 1000.0}


def run_wrk(
    url: str, body: bytes, *, concurrency: int, seconds: int, tmp: Path
) -> tuple[float, dict[str, float]]:
    """Drive the server with wrk (C, one thread): (reviews/s, {"50%": ms, ...}). wrk does not verify
    the certificate chain; it is here because it costs the shared CPUs far less than a Python client."""
    (tmp / "body.json").write_bytes(body)
    (tmp / "post.lua").write_text(WRK_SCRIPT.replace("{body}", str(tmp / "body.json")))
    out = subprocess.run(
        ["wrk", "-t1", f"-c{concurrency}", f"-d{seconds}s", "--latency", "-s", str(tmp / "post.lua"), url],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    if "Non-2xx" in out:
        raise SystemExit(f"wrk saw non-200 answers:\n{out}")
    rate = float(re.search(r"Requests/sec:\s+([0-9.]+)", out).group(1))
    pcts = {
        p: float(v) * _UNITS[u] for p, v, u in re.findall(r"^\s+(\d+%)\s+([0-9.]+)(us|ms|s)\s*$", out, re.M)
    }
    return rate, pcts


def server_side(metrics: str) -> str:
    """Share of reviews the handler answered within 1, 2 and 5 ms (server histogram, warm-up included)."""
    buckets = dict(
        re.findall(r'hami_webhook_review_duration_seconds_bucket\{le="([^"]+)"\} ([0-9.e+]+)', metrics)
    )
    total = float(buckets["+Inf"])
    shares = [
        f"<= {float(le) * 1000:g} ms: {float(buckets[le]) / total:.2%}" for le in ("0.001", "0.002", "0.005")
    ]
    return "handler time (server histogram): " + ", ".join(shares)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=20000)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--case", default="gpumem-gi-to-mib", help="golden case used as the review body")
    p.add_argument("--new-connections", action="store_true", help="one TLS handshake per request")
    p.add_argument(
        "--client",
        choices=["python", "wrk"],
        default="python",
        help="load generator: aiohttp (verifies the chain) or wrk (cheaper; needs `wrk` installed)",
    )
    p.add_argument("--seconds", type=int, default=10, help="duration of a wrk run")
    args = p.parse_args()
    golden = json.loads((ROOT / "tests" / "golden" / "webhook" / f"{args.case}.json").read_text())
    body = json.dumps(golden["request"]).encode()
    with tempfile.TemporaryDirectory() as tmp:
        proc, port, ctx = start_server(Path(tmp), [])
        if args.client == "wrk":
            try:
                url = f"https://127.0.0.1:{port}/mutate?timeout=10s"
                run_wrk(url, body, concurrency=args.concurrency, seconds=1, tmp=Path(tmp))  # warm-up
                cpu0 = cpu_seconds(proc.pid)
                rate, pcts = run_wrk(
                    url, body, concurrency=args.concurrency, seconds=args.seconds, tmp=Path(tmp)
                )
                cpu = cpu_seconds(proc.pid) - cpu0
            finally:
                proc.send_signal(signal.SIGTERM)
                proc.wait(timeout=10)
            print(f"webhook benchmark (wrk): case={args.case} body={len(body)} B concurrency={args.concurrency} "
                  f"keep-alive {args.seconds}s cpus={os.cpu_count()}")  # fmt: skip
            print(f"reviews/s: {rate:.0f}")
            print("latency ms: " + "  ".join(f"p{k[:-1]} {v:.2f}" for k, v in pcts.items()))
            print(f"server CPU per review: {cpu / (rate * args.seconds) * 1e6:.0f} us; "
                  f"load average {os.getloadavg()[0]:.2f}")  # fmt: skip
            return 0
        try:
            elapsed, lat, cpu, metrics = asyncio.run(
                drive(f"https://127.0.0.1:{port}/mutate?timeout=10s", body, ctx, requests=args.requests,
                      concurrency=args.concurrency, fresh=args.new_connections, pid=proc.pid)
            )  # fmt: skip
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=10)
    lat.sort()
    ms = [x * 1000 for x in lat]

    def pct(q: float) -> float:
        return ms[min(len(ms) - 1, int(q * len(ms)))]

    print(f"webhook benchmark: case={args.case} body={len(body)} B requests={len(ms)} "
          f"concurrency={args.concurrency} connections={'new per request' if args.new_connections else 'keep-alive'} "
          f"cpus={os.cpu_count()}")  # fmt: skip
    print(f"reviews/s: {len(ms) / elapsed:.0f}")
    print(f"latency ms: p50 {pct(0.50):.2f}  p90 {pct(0.90):.2f}  p99 {pct(0.99):.2f}  max {ms[-1]:.2f}  "
          f"mean {statistics.fmean(ms):.2f}")  # fmt: skip
    print(f"server CPU per review: {cpu / len(ms) * 1e6:.0f} us (capacity of one core: "
          f"{len(ms) / cpu if cpu else float('inf'):.0f} reviews/s); load average {os.getloadavg()[0]:.2f}")  # fmt: skip
    print(server_side(metrics))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
