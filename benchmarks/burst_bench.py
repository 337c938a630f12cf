"""Burst of GPU pods onto few nodes: time until every pod is allocated, with lock pipelining and with HAMi's
fail-on-locked bind, side by side in one run.

Why: the node lock lets one pod per node be between Bind and the device plugin's Allocate. HAMi fails a
Bind that finds the lock held, and kube-scheduler backs the pod off (1 s doubling to 10 s), so a Job's
burst starts at the pace of the backoff. With lock pipelining (``--bind-lock-wait``) the Bind waits for
the lock and takes it when the device plugin releases it.

Setup, all in this process: the in-memory API server (`kubefakes.apiserver`); the real extender
(`scheduler_extender.app.Server`, HTTP on 127.0.0.1) with ``--bind-lock-wait 25s`` (pipelining) or
``--bind-lock-wait 0`` (HAMi: fail at once); a kube-scheduler stand-in and a device plugin stand-in.

* kube-scheduler stand-in: one scheduling loop filters pods one at a time (nodeCacheCapable, every
  node a candidate) and hands each placed pod to its own binding cycle (binding cycles run in
  parallel, as kube-scheduler's binding goroutines do). A failed bind puts the pod into the backoff
  queue: 1 s, doubling per failed attempt, at most 10 s (kube-scheduler's podInitialBackoffSeconds /
  podMaxBackoffSeconds defaults); then it is filtered again.
* device plugin stand-in, one per node: when a pod is bound to its node (the Binding done), it spends
  ``--allocate-ms`` (default 300) on Allocate, then writes ``hami.io/bind-phase: success`` and
  releases the node lock, one pod after another, as kubelet calls Allocate per container.

Scenario: ``--pods`` (default 200) one-card pods onto ``--nodes`` (default 4) nodes that hold exactly
pods/nodes of them each (every pod fits). Ideal: pods per node x allocate time (all nodes allocating
in parallel, back to back). Prints, per mode, the time until all pods are ``bind-phase: success``, its
ratio to the ideal, failed binds and the longest bind.

    python benchmarks/burst_bench.py [--pods 200] [--nodes 4] [--allocate-ms 300]
                                     [--modes pipelined,fail-on-locked] [--timeout 600] [--load 2]

``--load F`` is the loaded variant: busy-loop processes are started so that this process and they
together ask for F times the machine's cores (F x cores - 1 burners), as when the extender shares its
node with other work; they are stopped at the end. Under load a handoff takes longer, so waiters
deeper in a queue are told at once that they cannot be served within ``--bind-lock-wait`` (and
back off, keeping their place); the figure to watch is still: every pod bound, and the time against
the serial floor (the ideal above). The load average at the start and at the end is printed.

Never part of the tests.
"""

from __future__ import annotations

import argparse
import asyncio
import heapq
import itertools
import json
import multiprocessing
import os
import sys
import time
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hami import annotations as A  # noqa: E402
from hami.model import Device  # noqa: E402
from hami.registration import encode_node_devices_json  # noqa: E402
from kubefakes.apiserver import FakeApiServer  # noqa: E402
from scheduler_extender.app import Server  # noqa: E402
from scheduler_extender.cli import parse_args  # noqa: E402

MODES = {"pipelined": "25s", "fail-on-locked": "0"}
INITIAL_BACKOFF_S = 1.0
MAX_BACKOFF_S = 10.0
CARD_MEM = 40960
SPLIT = 10


def node_obj(name: str, slots: int) -> dict:
    n_cards = -(-slots // SPLIT)
    devices = [Device(f"GPU-{name}-{i}", i, SPLIT, CARD_MEM, 100, "NVIDIA-A100", 0) for i in range(n_cards)]
    res = {"cpu": "64", "memory": "256Gi", "pods": "110", "nvidia.com/gpu": str(n_cards * SPLIT)}
    return {
        "metadata": {
            "name": name,
            "labels": {"kubernetes.io/hostname": name},
            "annotations": {A.NVIDIA_REGISTER: encode_node_devices_json(devices)},
        },
        "spec": {},
        "status": {"capacity": res, "allocatable": res, "conditions": [{"type": "Ready", "status": "True"}]},
    }


def pod_obj(name: str, mem: int) -> dict:
    limits = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": str(mem), "nvidia.com/gpucores": "10"}
    return {
        "metadata": {"name": name, "namespace": "default", "labels": {"job-name": "burst"}},
        "spec": {
            "schedulerName": "hami-scheduler",
            "containers": [{"name": "main", "image": "cuda", "resources": {"limits": limits, "requests": limits}}],
        },
        "status": {"phase": "Pending"},
    }


def informer_view(obj: dict) -> dict:
    out = json.loads(json.dumps(obj))
    out.pop("apiVersion", None)
    out.pop("kind", None)
    return out


class Burst:
    """One mode's run: the API server, the extender, the two stand-ins."""

    def __init__(self, args: argparse.Namespace, mode: str) -> None:
        self.args = args
        self.mode = mode
        self.nodes = [f"node{i}" for i in range(args.nodes)]
        self.failed_binds = 0
        self.bind_s: list[float] = []
        self.allocated: dict[str, float] = {}
        self.dp_queues: dict[str, asyncio.Queue[str]] = {}
        self.backoff: list[tuple[float, int, str]] = []  # kube-scheduler's backoff queue: (ready at, seq, pod)
        self.active: asyncio.Queue[str] = asyncio.Queue()
        self.attempts: dict[str, int] = {}
        self.seq = itertools.count()
        self.done = asyncio.Event()

    async def run(self) -> float:
        args = self.args
        per_node = -(-args.pods // args.nodes)
        api = FakeApiServer(history_size=100000).start()
        for n in self.nodes:
            api.store.create("nodes", node_obj(n, per_node))
        self.api = api
        opts = parse_args(
            ["--kubeconfig", str(api.kubeconfig_path), "--address", "127.0.0.1", "--port", "0",
             "--register-interval", "0", "--log-level", "WARNING", "--bind-lock-wait", MODES[self.mode]],
            env={},
        )  # fmt: skip
        server = Server(opts)
        await server.start()
        self.server = server
        try:
            deadline = time.monotonic() + 60
            while server.runtime.readiness() is not None:
                if time.monotonic() > deadline:
                    raise SystemExit(f"extender not ready: {server.runtime.readiness()}")
                await asyncio.sleep(0.05)
            # Each pod's memory: the node's cards exactly full after pods/nodes pods (every pod fits).
            mem = CARD_MEM // SPLIT
            names = [f"burst-{i}" for i in range(args.pods)]
            for name in names:
                api.store.create("pods", pod_obj(name, mem))
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=512)) as session:
                self.session = session
                self.url = server.url
                tasks = [asyncio.create_task(self.device_plugin(n)) for n in self.nodes]
                t0 = time.perf_counter()
                self.t0 = t0
                for name in names:
                    self.active.put_nowait(name)
                tasks.append(asyncio.create_task(self.scheduling_loop()))
                tasks.append(asyncio.create_task(self.backoff_mover()))
                try:
                    await asyncio.wait_for(self.done.wait(), args.timeout)
                    elapsed = time.perf_counter() - t0
                except TimeoutError:
                    elapsed = float("inf")
                for t in tasks:
                    t.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
            self.handoffs = server.lock_queues.handoffs
            self.told_early = getattr(server.lock_queues, "told_early", 0)
            return elapsed
        finally:
            await server.stop()
            api.stop()

    async def post(self, verb: str, body: dict) -> dict:
        async with self.session.post(
            f"{self.url}/{verb}", data=json.dumps(body), headers={"Content-Type": "application/json"},
            timeout=aiohttp.ClientTimeout(total=30),  # the chart's httpTimeout
        ) as r:
            return json.loads(await r.read())

    async def scheduling_loop(self) -> None:
        """kube-scheduler's scheduling cycle: one pod at a time; binding cycles run in parallel."""
        while True:
            name = await self.active.get()
            pod = self.api.store.get("pods", name, namespace="default")
            result = await self.post("filter", {"Pod": informer_view(pod), "Nodes": None, "NodeNames": self.nodes})
            chosen = result.get("NodeNames") or []
            if result.get("Error") or not chosen:
                self.requeue(name)
                continue
            asyncio.create_task(self.binding_cycle(pod, chosen[0]))

    async def binding_cycle(self, pod: dict, node: str) -> None:
        meta = pod["metadata"]
        t = time.perf_counter()
        try:
            result = await self.post(
                "bind", {"PodName": meta["name"], "PodNamespace": "default", "PodUID": meta["uid"], "Node": node}
            )
        except (TimeoutError, aiohttp.ClientError):
            result = {"Error": "timeout"}
        self.bind_s.append(time.perf_counter() - t)
        if result["Error"]:
            self.failed_binds += 1
            self.requeue(meta["name"])
            return
        self.dp_queues[node].put_nowait(meta["name"])

    def requeue(self, name: str) -> None:
        """A failed attempt: into the backoff queue (1 s doubling per attempt, at most 10 s)."""
        tries = self.attempts.get(name, 0)
        self.attempts[name] = tries + 1
        wait = min(MAX_BACKOFF_S, INITIAL_BACKOFF_S * 2**tries)
        heapq.heappush(self.backoff, (time.perf_counter() + wait, next(self.seq), name))

    async def backoff_mover(self) -> None:
        """Backed-off pods go back to the active queue when their backoff ends (kube-scheduler flushes
        the backoff queue every second; checked more often here so the figures are not rounded up)."""
        while True:
            now = time.perf_counter()
            while self.backoff and self.backoff[0][0] <= now:
                _, _, name = heapq.heappop(self.backoff)
                self.active.put_nowait(name)
            await asyncio.sleep(0.05)

    async def device_plugin(self, node: str) -> None:
        """Allocate one bound pod after another on `node`: --allocate-ms, then success + lock released."""
        queue: asyncio.Queue[str] = asyncio.Queue()
        self.dp_queues[node] = queue
        while True:
            name = await queue.get()
            await asyncio.sleep(self.args.allocate_ms / 1000)
            self.api.store.patch(
                "pods", name, {"metadata": {"annotations": {A.BIND_PHASE: "success"}}}, namespace="default"
            )
            self.api.store.patch("nodes", node, {"metadata": {"annotations": {A.NODE_LOCK: None}}})
            self.allocated[name] = time.perf_counter() - self.t0
            if len(self.allocated) == self.args.pods:
                self.done.set()


def burn() -> None:
    """A burner process: one core's worth of runnable work until it is terminated."""
    while True:
        pass


def start_burners(load: float) -> list[multiprocessing.Process]:
    cores = os.cpu_count() or 1
    n = max(0, round(load * cores) - 1)  # this process is the one more
    procs = [multiprocessing.Process(target=burn, daemon=True) for _ in range(n)]
    for p in procs:
        p.start()
    return procs


def loadavg() -> str:
    try:
        return " / ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "unknown"


async def main_async(args: argparse.Namespace) -> None:
    per_node = -(-args.pods // args.nodes)
    ideal = per_node * args.allocate_ms / 1000
    print(f"{args.pods} pods, {args.nodes} nodes ({per_node} pods each fill a node), allocate "
          f"{args.allocate_ms:g} ms per pod; ideal {ideal:.1f}s")  # fmt: skip
    burners = start_burners(args.load) if args.load > 0 else []
    try:
        if burners:
            print(f"loaded: {len(burners)} burner processes on {os.cpu_count()} cores (--load {args.load:g})")
            time.sleep(2.0)  # let the burners get going
        print(f"load average (1/5/15 min) at the start: {loadavg()}")
        for mode in args.modes.split(","):
            burst = Burst(args, mode)
            elapsed = await burst.run()
            bound = len(burst.allocated)
            longest = max(burst.bind_s) if burst.bind_s else 0.0
            print(f"{mode:15s} (--bind-lock-wait {MODES[mode]}): {bound}/{args.pods} pods bind-phase success "
                  f"in {elapsed:.1f}s = {elapsed / ideal:.2f}x ideal; failed binds {burst.failed_binds} "
                  f"({burst.told_early} told early), binds that waited for the lock {burst.handoffs}, "
                  f"longest bind {longest:.1f}s")  # fmt: skip
        print(f"load average (1/5/15 min) at the end: {loadavg()}")
    finally:
        for p in burners:
            p.terminate()
        for p in burners:
            p.join(5)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pods", type=int, default=200)
    p.add_argument("--nodes", type=int, default=4)
    p.add_argument("--allocate-ms", type=float, default=300.0, help="device plugin time per pod (default 300)")
    p.add_argument("--modes", default="pipelined,fail-on-locked",
                   help="comma-separated: pipelined (--bind-lock-wait 25s), fail-on-locked (HAMi: 0)")  # fmt: skip
    p.add_argument("--timeout", type=float, default=600.0, help="give a mode up after this many seconds")
    p.add_argument("--load", type=float, default=0.0,
                   help="loaded variant: burner processes so that F x cores are asked for (e.g. 2)")  # fmt: skip
    args = p.parse_args()
    for m in args.modes.split(","):
        if m not in MODES:
            p.error(f"--modes: unknown mode {m!r}; valid: {', '.join(MODES)}")
    asyncio.run(main_async(args))


if __name__ == "__main__":
    main()
