"""Filter latency and filter+bind throughput of the scheduler extender on the openb cluster (1213 GPU nodes).

Setup: the in-memory API server (`kubefakes.apiserver`) runs in this process and gets the 1213 nodes of
../shared/data/alibaba-gpu-v2023/openb_node_list_gpu_node.csv, each registered as HAMi's NVIDIA device
plugin would (cards ``NVIDIA-<model>`` with the MiB of the data's README, split count 10, allocatable
``nvidia.com/gpu``, a fresh handshake). The extender runs as its own process (`python -m scheduler_extender`,
plain HTTP), exactly as next to kube-scheduler. Pods are the GPU rows of openb_pod_list_default.csv
(``gpu-milli`` shares as gpucores + gpumem-percentage, whole cards as gpucores 100).

Load, shaped like kube-scheduler: `--filter-clients` scheduling loops (kube-scheduler has one) each send
the pod's ExtenderArgs with `--candidates` node names (kube-scheduler sends about 40 % of 1213 nodes,
rotating the start; nodeCacheCapable: true), and hand the chosen node to a pool of `--binders`
asynchronous binders (kube-scheduler binds in goroutines). After a successful bind the simulated device
plugin marks the pod allocated and releases the node lock (what Allocate does). A failed bind (node
lock held by a pod still being allocated) re-queues the pod like kube-scheduler does.
`--warmup` pods are placed first (loading the cluster, not measured), then `--pods` are measured.

    python benchmarks/extender_bench.py [--pods 3000] [--warmup 2000] [--filter-clients 1] [--binders 16]
                                        [--candidates 485] [--filter-only 1000] [--profile out.prof]
                                        [--rate 200]

`--rate N` replaces the closed loop by an open one: a filter starts every 1/N s whatever the previous
one is doing (a steady offered load), so latency is measured below saturation. `--driver-gc-freeze`
keeps this process's own garbage collections (it hosts the API server with every pod and a long watch
history) from stalling the requests it serves; it changes nothing in the extender.

Prints p50/p90/p99/max of client-observed filter and bind latency over HTTP, filter+bind (pods bound)
per second, the extender's CPU seconds per pod, and then the latency of `--filter-only` sequential
filters with no bind traffic (the scheduling loop's own view when binds are not competing for the CPU). Targets (issue 3, 2-core machine): filter p99 <= 10 ms,
>= 300 filter+bind per second. Never part of the tests.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hami import annotations as A  # noqa: E402
from hami.config import DeviceConfig  # noqa: E402
from hami.simulate.openb import load_nodes, load_pods  # noqa: E402
from kubefakes.apiserver import FakeApiServer  # noqa: E402

# The trace beside the checkout, or where HAMI_TRACE_DIR names it (a second checkout elsewhere).
DATA = Path(os.environ.get("HAMI_TRACE_DIR", ROOT.parent / "shared" / "data" / "alibaba-gpu-v2023"))


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def pct(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, int(round(p / 100 * (len(s) - 1))))]


async def server_sums(session: aiohttp.ClientSession, url: str) -> dict[str, float]:
    """The extender's own filter/bind duration sums and counts (seconds) from /metrics."""
    async with session.get(f"{url}/metrics") as r:
        text = await r.text()
    out = {}
    for line in text.splitlines():
        for verb in ("filter", "bind"):
            for part in ("sum", "count"):
                prefix = f"hami_scheduler_{verb}_duration_seconds_{part} "
                if line.startswith(prefix):
                    out[f"{verb}_{part}"] = float(line[len(prefix) :])
    return out


def seed_nodes(api: FakeApiServer) -> list[str]:
    config = DeviceConfig()
    stamp = A.encode_handshake(A.HANDSHAKE_REQUESTING, datetime.now())
    names = []
    for node in load_nodes(DATA / "openb_node_list_gpu_node.csv", config=config):
        obj = node.obj
        obj.pop("apiVersion", None)
        obj.pop("kind", None)
        obj["metadata"].setdefault("annotations", {})[A.NVIDIA_HANDSHAKE] = stamp
        alloc = obj["status"]["allocatable"]
        alloc["nvidia.com/gpu"] = str(len(node.cards) * config.nvidia.deviceSplitCount)
        obj["status"]["capacity"] = dict(alloc)
        api.store.create("nodes", obj)
        names.append(node.name)
    return names


def trace_pods(limit: int) -> list[dict]:
    pods = [
        p.obj
        for p in load_pods(DATA / "openb_pod_list_default.csv", config=DeviceConfig())
        if p.is_gpu and p.unplaceable is None
    ]
    out = []
    while len(out) < limit:
        for p in pods:
            if len(out) == limit:
                break
            obj = json.loads(json.dumps(p))
            obj.pop("apiVersion", None)
            obj.pop("kind", None)
            obj["metadata"]["name"] = f"{obj['metadata']['name']}-{len(out)}"
            obj["spec"]["schedulerName"] = "hami-scheduler"
            out.append(obj)
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_extender(
    kubeconfig: str, port: int, profile: str | None, extra: list[str], root: Path = ROOT
) -> subprocess.Popen:
    """The extender of the checkout at `root` (another checkout's code under this load driver: A/B runs)."""
    cmd = [sys.executable]
    if profile:
        # yappi (pip install yappi) sees every thread; cProfile would only see the idle event loop.
        code = (
            "import sys, yappi; yappi.set_clock_type('cpu'); yappi.start(builtins=True)\n"
            "from scheduler_extender.cli import main\n"
            "try:\n    main(sys.argv[1:])\n"
            f"finally:\n    yappi.stop(); yappi.get_func_stats().save({profile!r}, type='pstat')"
        )
        cmd += ["-c", code]
    else:
        cmd += ["-m", "scheduler_extender"]
    cmd += [ "--kubeconfig", kubeconfig, "--address", "127.0.0.1", "--port", str(port),
            "--register-interval", "0", "--log-level", "WARNING", *extra]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.Popen(cmd, cwd=root, env=env)


class Driver:
    def __init__(
        self, api: FakeApiServer, session: aiohttp.ClientSession, url: str, nodes: list[str], args
    ) -> None:  # type: ignore[no-untyped-def]
        self.api = api
        self.session = session
        self.url = url
        self.nodes = nodes
        self.args = args
        self.offset = 0
        self.filter_ms: list[float] = []
        self.bind_ms: list[float] = []
        self.bound = 0
        self.unschedulable = 0
        self.bind_errors: dict[str, int] = {}
        self.errors: list[str] = []

    def candidates(self) -> list[str]:
        n = min(self.args.candidates, len(self.nodes))
        start = self.offset
        self.offset = (self.offset + n) % len(self.nodes)
        return [self.nodes[(start + i) % len(self.nodes)] for i in range(n)]

    async def post(self, verb: str, body: bytes) -> tuple[float, dict]:
        t0 = time.perf_counter()
        async with self.session.post(
            f"{self.url}/{verb}", data=body, headers={"Content-Type": "application/json"}
        ) as r:
            data = await r.read()
        ms = (time.perf_counter() - t0) * 1000
        assert r.status == 200, (r.status, data[:200])
        return ms, json.loads(data)

    async def schedule(self, queue: asyncio.Queue, binds: asyncio.Queue, record: bool) -> None:
        while True:
            pod, tries = await queue.get()
            try:
                body = json.dumps({"Pod": pod, "Nodes": None, "NodeNames": self.candidates()}).encode()
                ms, result = await self.post("filter", body)
                if record:
                    self.filter_ms.append(ms)
                if result["Error"]:
                    self.errors.append(result["Error"])
                elif result["NodeNames"]:
                    await binds.put((pod, result["NodeNames"][0], tries, queue))
                else:
                    self.unschedulable += 1
            finally:
                queue.task_done()

    async def paced(self, pods: list[dict], binds: asyncio.Queue, rate: float) -> None:
        """An open-loop scheduler: start one filter every 1/`rate` s whether or not the last answered."""
        queue: asyncio.Queue = asyncio.Queue()  # re-queued pods (failed binds) are retried by the loop
        retry = asyncio.create_task(self.schedule(queue, binds, True))
        inflight: set[asyncio.Task] = set()
        t0 = time.perf_counter()
        for i, pod in enumerate(pods):
            delay = t0 + i / rate - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            one: asyncio.Queue = asyncio.Queue()
            one.put_nowait((pod, 0))
            task = asyncio.create_task(self._one(one, queue, binds))
            inflight.add(task)
            task.add_done_callback(inflight.discard)
        await asyncio.gather(*list(inflight))
        await queue.join()
        retry.cancel()

    async def _one(self, one: asyncio.Queue, retry_queue: asyncio.Queue, binds: asyncio.Queue) -> None:
        pod, tries = one.get_nowait()
        body = json.dumps({"Pod": pod, "Nodes": None, "NodeNames": self.candidates()}).encode()
        ms, result = await self.post("filter", body)
        self.filter_ms.append(ms)
        if result["Error"]:
            self.errors.append(result["Error"])
        elif result["NodeNames"]:
            await binds.put((pod, result["NodeNames"][0], tries, retry_queue))
        else:
            self.unschedulable += 1

    async def binder(self, binds: asyncio.Queue, record: bool) -> None:
        while True:
            pod, node, tries, queue = await binds.get()
            try:
                meta = pod["metadata"]
                body = json.dumps({"PodName": meta["name"], "PodNamespace": meta["namespace"],
                                   "PodUID": meta["uid"], "Node": node}).encode()  # fmt: skip
                ms, result = await self.post("bind", body)
                if record:
                    self.bind_ms.append(ms)
                if result["Error"]:
                    err = result["Error"]
                    key = "node lock held by a pod being allocated" if "is locked by" in err else err[:80]
                    self.bind_errors[key] = self.bind_errors.get(key, 0) + 1
                    if tries < 5:
                        fresh = self.api.store.get("pods", meta["name"], namespace=meta["namespace"])
                        if fresh is not None:
                            fresh.pop("apiVersion", None)
                            fresh.pop("kind", None)
                            queue.put_nowait((fresh, tries + 1))
                else:
                    self.bound += 1
                    # The device plugin's Allocate: bind-phase success, lock released.
                    self.api.store.patch("pods", meta["name"], {"metadata": {"annotations": {A.BIND_PHASE: "success"}}},
                                         namespace=meta["namespace"])  # fmt: skip
                    self.api.store.patch("nodes", node, {"metadata": {"annotations": {A.NODE_LOCK: None}}})
            finally:
                binds.task_done()

    async def filter_only(self, pods: list[dict]) -> list[float]:
        """Sequential filters with no bind traffic (the scheduling loop alone): client-observed ms."""
        out = []
        for p in pods:
            stored = self.api.store.create("pods", p)
            stored.pop("apiVersion", None)
            stored.pop("kind", None)
            body = json.dumps({"Pod": stored, "Nodes": None, "NodeNames": self.candidates()}).encode()
            ms, result = await self.post("filter", body)
            assert not result["Error"], result["Error"]
            out.append(ms)
            if ms > 1000:
                print(f"  slow filter: {ms:.0f} ms (#{len(out)})")
        return out

    async def run(self, pods: list[dict], record: bool, rate: float = 0.0) -> float:
        queue: asyncio.Queue = asyncio.Queue()
        binds: asyncio.Queue = asyncio.Queue()
        stored_pods = []
        for p in pods:
            stored = self.api.store.create("pods", p)
            stored.pop("apiVersion", None)
            stored.pop("kind", None)
            stored_pods.append(stored)
        tasks = [asyncio.create_task(self.binder(binds, record)) for _ in range(self.args.binders)]
        t0 = time.perf_counter()
        if rate > 0:
            await self.paced(stored_pods, binds, rate)
            await binds.join()
        else:
            for stored in stored_pods:
                queue.put_nowait((stored, 0))
            tasks += [
                asyncio.create_task(self.schedule(queue, binds, record))
                for _ in range(self.args.filter_clients)
            ]
            while True:
                await queue.join()
                await binds.join()
                if queue.empty():
                    break
        elapsed = time.perf_counter() - t0
        for t in tasks:
            t.cancel()
        return elapsed


def breakdown(candidates: int) -> None:
    """CPU cost of the parts of one filter+bind, each measured alone (process CPU time, not wall)."""
    from hami.cluster import ClusterState
    from hami.kube import KubeClient

    api = FakeApiServer().start()
    names = seed_nodes(api)
    state = ClusterState()
    for n in api.store.list("nodes"):
        state.upsert_node(n)
    pods = [api.store.create("pods", p) for p in trace_pods(1000)]
    api.stop()
    t0 = time.process_time()
    for i, p in enumerate(pods):
        state.filter(p, [names[(i * candidates + k) % len(names)] for k in range(candidates)])
    per_filter = 1000 * (time.process_time() - t0) / len(pods)
    print(
        f"ClusterState.filter ({candidates} candidates, cluster filling up): {per_filter:.2f} ms CPU per call"
    )
    # --filter-mode all on the filled cluster: every fitting candidate (/filter), the scores (/prioritize).
    from scheduler_extender.candidates import fitting_nodes, prioritize_scores

    fresh = trace_pods(1200)[1000:]
    for p in fresh:
        p["metadata"]["uid"] = p["metadata"]["name"]
    for label, fn in (("fitting_nodes (--filter-mode all /filter)", fitting_nodes),
                      ("prioritize_scores (/prioritize)", prioritize_scores)):  # fmt: skip
        t0 = time.process_time()
        for i, p in enumerate(fresh):
            fn(state, p, [names[(i * candidates + k) % len(names)] for k in range(candidates)])
        print(f"{label} ({candidates} candidates): {1000 * (time.process_time() - t0) / len(fresh):.2f} ms CPU per call")

    # The wire: decode one ExtenderArgs (a trace pod + the candidate names) and encode the filter reply
    # (one node passes, every other candidate with a reason), with the standard library and as served.
    import orjson

    from scheduler_extender.wire import parse_filter_args

    cand = [names[k] for k in range(candidates)]
    body = json.dumps({"Pod": pods[0], "Nodes": None, "NodeNames": cand}).encode()
    reply = {"Nodes": None, "NodeNames": cand[:1], "FailedAndUnresolvableNodes": None, "Error": "",
             "FailedNodes": {n: f"node {cand[0]} chosen" for n in cand[1:]}}  # fmt: skip
    codecs = {
        "ExtenderArgs decode, json.loads": lambda: json.loads(body),
        "ExtenderArgs decode, orjson.loads": lambda: orjson.loads(body),
        "parse_filter_args (decode + checks)": lambda: parse_filter_args(body),
        "filter reply encode, json.dumps": lambda: json.dumps(reply, separators=(",", ":")).encode(),
        "filter reply encode, as served (orjson)": lambda: orjson.dumps(reply),
    }
    for label, fn in codecs.items():
        t0 = time.process_time()
        for _ in range(2000):
            fn()
        print(f"{label:40s} {1e6 * (time.process_time() - t0) / 2000:.1f} us CPU per call ({len(body)} B body)")

    # API calls: the server in its own process, so only the client's CPU is counted.
    with tempfile.TemporaryDirectory() as tmp:
        kubeconfig = Path(tmp) / "kubeconfig"
        server = subprocess.Popen(
            [sys.executable, "-m", "kubefakes.apiserver", "--port", "0", "--kubeconfig-out", str(kubeconfig)],
            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 30
            while not (kubeconfig.exists() and kubeconfig.read_text()):
                if time.monotonic() > deadline:
                    raise SystemExit("test API server did not start")
                time.sleep(0.05)
            time.sleep(0.3)
            client = KubeClient.from_kubeconfig(str(kubeconfig))
            client.create("nodes", {"metadata": {"name": "n1", "annotations": {"a": "b"}}})
            pod = client.create_pod({"metadata": {"name": "p", "namespace": "default"},
                                     "spec": {"containers": [{"name": "c", "image": "x"}]}})  # fmt: skip
            uid = pod["metadata"]["uid"]
            calls = {
                "get node (node lock read)": lambda i: client.get_node("n1"),
                "patch node (node lock write)": lambda i: client.patch_node_annotations("n1", {"y": str(i)}),
                "patch pod (filter record / bind-phase)": lambda i: client.patch_pod_metadata(
                    "default", "p", annotations={"x": str(i)}, uid=uid
                ),
                "create event": lambda i: client.create_event(pod, reason="R", message=f"m{i}"),
            }
            for label, fn in calls.items():
                t0 = time.process_time()
                for i in range(500):
                    fn(i)
                print(f"{label:40s} {1000 * (time.process_time() - t0) / 500:.2f} ms client CPU per call")
            # The same calls as the extender now sends them: coroutines on the event loop (aiohttp).
            acalls = {
                "patch node, coroutine": lambda i: client.apatch_node_annotations("n1", {"y": str(i)}),
                "patch pod, coroutine": lambda i: client.apatch_pod_metadata(
                    "default", "p", annotations={"x": str(i)}, uid=uid
                ),
                "create event, coroutine": lambda i: client.acreate_event(pod, reason="R", message=f"a{i}"),
            }

            async def run_async() -> None:
                for label, fn in acalls.items():
                    await fn(-1)  # the session and its connection open outside the measurement
                    t0 = time.process_time()
                    for i in range(500):
                        await fn(i)
                    print(f"{label:40s} {1000 * (time.process_time() - t0) / 500:.2f} ms client CPU per call")
                await client.aclose()

            asyncio.run(run_async())
            client.close()
        finally:
            server.terminate()
            server.wait(10)


async def main_async(args: argparse.Namespace) -> None:
    api = FakeApiServer(history_size=200000).start()
    t0 = time.perf_counter()
    nodes = seed_nodes(api)
    pods = trace_pods(args.warmup + args.pods)
    print(f"seeded {len(nodes)} nodes, {sum(1 for _ in nodes)} registered, in {time.perf_counter() - t0:.1f}s; "
          f"{len(pods)} trace pods")  # fmt: skip
    if args.driver_switch_interval:
        # This process runs the in-memory API server's thread beside the load driver's loop: each waits
        # up to the interpreter's switch interval (5 ms) for the other's GIL, which a Go kube-apiserver
        # and kube-scheduler never do. It changes nothing in the extender.
        sys.setswitchinterval(args.driver_switch_interval)
    if args.driver_gc_freeze:
        # The in-process API server keeps every pod and a long watch history: a full collection of this
        # process (the load driver + API server, not the extender) stalls every request for ~150 ms.
        gc.freeze()
        gc.set_threshold(100_000, 50, 100)
    port = free_port()
    root = Path(args.extender_root).resolve() if args.extender_root else ROOT
    proc = start_extender(str(api.kubeconfig_path), port, args.profile, args.extender_args.split(), root)
    print(f"extender code: {root}, load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    url = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=256)) as session:
            deadline = time.monotonic() + 60
            while True:
                try:
                    async with session.get(f"{url}/readyz") as r:
                        if r.status == 200:
                            break
                except aiohttp.ClientError:
                    pass
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise SystemExit("extender did not become ready")
                await asyncio.sleep(0.1)
            print(f"extender ready after {time.perf_counter() - t0:.1f}s (pid {proc.pid})")
            driver = Driver(api, session, url, nodes, args)
            if args.warmup:
                w = await driver.run(pods[: args.warmup], record=False)
                print(f"warm-up: {args.warmup} pods in {w:.1f}s ({driver.bound} bound)")
            driver.bound = driver.unschedulable = 0
            driver.bind_errors.clear()
            # The /metrics scrapes (every card's gauges: ~0.5 s of extender CPU on this cluster) stay
            # outside the CPU window: they are the benchmark's reading, not a per-pod cost.
            sums0 = await server_sums(session, url)
            cpu0, own0 = cpu_seconds(proc.pid), cpu_seconds(os.getpid())
            elapsed = await driver.run(pods[args.warmup :], record=True, rate=args.rate)
            cpu, own = cpu_seconds(proc.pid) - cpu0, cpu_seconds(os.getpid()) - own0
            sums1 = await server_sums(session, url)
            server = {k: sums1.get(k, 0.0) - sums0.get(k, 0.0) for k in sums1}
            f, b = driver.filter_ms, driver.bind_ms
            load = (
                f"offered {args.rate:g} pods/s (open loop)"
                if args.rate
                else f"{args.filter_clients} filter client(s)"
            )
            print(f"measured: {args.pods} pods, {load}, {args.binders} binders, "
                  f"{args.candidates} candidate nodes per filter")  # fmt: skip
            print(f"filter latency ms: p50 {pct(f, 50):.2f}  p90 {pct(f, 90):.2f}  p99 {pct(f, 99):.2f}  "
                  f"max {max(f):.2f}  mean {statistics.fmean(f):.2f}  (n={len(f)})")  # fmt: skip
            if b:
                print(f"bind latency ms:   p50 {pct(b, 50):.2f}  p90 {pct(b, 90):.2f}  p99 {pct(b, 99):.2f}  "
                      f"max {max(b):.2f}  (n={len(b)})")  # fmt: skip
            print(f"filter+bind: {driver.bound} pods bound in {elapsed:.2f}s = {driver.bound / elapsed:.0f}/s; "
                  f"{driver.unschedulable} unschedulable; failed binds (pod re-queued) {driver.bind_errors or 0}; "
                  f"filter errors {len(driver.errors)}")  # fmt: skip
            print(f"extender CPU: {cpu:.2f}s = {1000 * cpu / max(1, len(f)):.2f} ms per filter+bind "
                  f"({100 * cpu / elapsed:.0f}% of one core); load driver + API server process: "
                  f"{100 * own / elapsed:.0f}% of one core")  # fmt: skip
            if server.get("filter_count"):
                print(f"inside the extender (its histograms): filter mean "
                      f"{1000 * server['filter_sum'] / server['filter_count']:.2f} ms, bind mean "
                      f"{1000 * server.get('bind_sum', 0) / max(1, server.get('bind_count', 0)):.2f} ms")  # fmt: skip
            if driver.errors:
                print("first filter error:", driver.errors[0])
            if args.filter_only:
                extra = trace_pods(args.warmup + args.pods + args.filter_only)[args.warmup + args.pods :]
                for p in extra:
                    p["metadata"]["name"] += "-fo"
                fo = await driver.filter_only(extra)
                print(f"filter only (no concurrent binds), {len(fo)} sequential filters, ms: p50 {pct(fo, 50):.2f}  "
                      f"p90 {pct(fo, 90):.2f}  p99 {pct(fo, 99):.2f}  max {max(fo):.2f}")  # fmt: skip
        print(f"load average at the end {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
        api.stop()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pods", type=int, default=3000, help="measured pods (default 3000)")
    p.add_argument("--warmup", type=int, default=2000, help="pods placed before measuring (default 2000)")
    p.add_argument("--filter-clients", type=int, default=1, help="concurrent scheduling loops (default 1)")
    p.add_argument("--binders", type=int, default=16, help="concurrent binds (default 16)")
    p.add_argument("--candidates", type=int, default=485, help="node names per filter (default 485 = 40%%)")
    p.add_argument(
        "--filter-only", type=int, default=1000, help="then N filters without binds (default 1000)"
    )
    p.add_argument("--rate", type=float, default=0.0,
                   help="offer pods at this steady rate per second instead of a closed scheduling loop")  # fmt: skip
    p.add_argument("--driver-gc-freeze", action="store_true",
                   help="freeze and thin out garbage collection in this process (load driver + API server)")  # fmt: skip
    p.add_argument("--driver-switch-interval", type=float, default=0.0,
                   help="sys.setswitchinterval() of this process (API server + load driver), e.g. 0.0005")  # fmt: skip
    p.add_argument("--extender-args", default="", help="extra extender flags, e.g. '--events failures'")
    p.add_argument("--extender-root", help="run the extender of this checkout (default: this one), "
                   "for side-by-side runs of two versions under the same load driver")
    p.add_argument("--profile", help="profile every extender thread with yappi (CPU clock), pstat file")
    p.add_argument("--breakdown", action="store_true", help="only measure the CPU cost of each part, alone")
    args = p.parse_args()
    if args.breakdown:
        breakdown(args.candidates)
        return
    asyncio.run(main_async(args))


if __name__ == "__main__":
    main()
