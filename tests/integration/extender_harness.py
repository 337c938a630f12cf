"""Shared pieces of the extender integration tests (no tests here): the real extender started on
127.0.0.1:0 against `kubefakes.apiserver`, and a kube-scheduler-shaped HTTP client. Object builders are
in `tests.builders`.

The client sends exactly what kube-scheduler's HTTPExtender sends (k8s-protocols §1.1/§1.5/§1.6):
POST of Go-marshalled structs with PascalCase keys and explicit nulls, the Pod as the scheduler's
informer holds it (no apiVersion/kind), in either cache mode.
"""

from __future__ import annotations

import asyncio
import copy
import json
from collections.abc import Mapping, Sequence
from typing import Any

import aiohttp

from hami import annotations as A
from kubefakes.apiserver import FakeApiServer
from kubefakes.apiserver.status import ApiStatusError
from scheduler_extender.cli import Server, parse_args


def informer_view(obj: Mapping[str, Any]) -> dict[str, Any]:
    """An object as kube-scheduler's informer holds it: no apiVersion/kind, no managedFields."""
    out = copy.deepcopy(dict(obj))
    out.pop("apiVersion", None)
    out.pop("kind", None)
    out.get("metadata", {}).pop("managedFields", None)
    return out


async def start_extender(api: FakeApiServer, *flags: str) -> Server:
    """The real extender (`scheduler_extender.cli.Server`) on 127.0.0.1:0, started and ready."""
    args = parse_args(
        [
            "--kubeconfig",
            str(api.kubeconfig_path),
            "--address",
            "127.0.0.1",
            "--port",
            "0",
            "--register-interval",
            "0",
            "--kube-timeout",
            "2",
            "--workers",
            "16",
            *flags,
        ],
        env={},
    )
    server = Server(args)
    # Tests stay fast: few, quick retries against the fake server.
    server.client.retries = 3
    server.client.retry_initial_wait_s = 0.01
    server.client.retry_max_wait_s = 0.05
    await server.start()
    return server


async def wait_ready(server: Server, timeout_s: float = 10.0) -> None:
    """Until /readyz would answer 200."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while server.runtime.readiness() is not None:
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"extender not ready: {server.runtime.readiness()}")
        await asyncio.sleep(0.02)


async def watches_open(api: FakeApiServer, timeout_s: float = 10.0) -> None:
    """Until the extender's three watches (nodes, pods, resourcequotas) are open at the API server.

    Ready means listed: each reflector sends its watch request just after its list, so a test that
    counts API requests must wait for these three first, or one lands inside the counted span.
    """
    kinds = ("nodes", "pods", "resourcequotas")
    await eventually(lambda: all(api.open_watch_count(k) >= 1 for k in kinds), timeout_s, "the watches open")


async def eventually(predicate, timeout_s: float = 5.0, what: str = "condition") -> None:  # type: ignore[no-untyped-def]
    """Poll `predicate()` (sync) until true."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not predicate():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


class Scheduler:
    """A kube-scheduler-shaped client of one extender URL."""

    def __init__(self, session: aiohttp.ClientSession, url: str, *, cache_capable: bool = True) -> None:
        self.session = session
        self.url = url.rstrip("/")
        self.cache_capable = cache_capable

    def filter_args(self, pod: Mapping[str, Any], nodes: Sequence[Mapping[str, Any]] | Sequence[str]) -> dict:
        if self.cache_capable:
            names = [n if isinstance(n, str) else n["metadata"]["name"] for n in nodes]
            return {"Pod": informer_view(pod), "Nodes": None, "NodeNames": names}
        items = [informer_view(n) for n in nodes if not isinstance(n, str)]
        return {"Pod": informer_view(pod), "Nodes": {"metadata": {}, "items": items}, "NodeNames": None}

    async def post(self, verb: str, body: bytes | str | dict) -> tuple[int, Any]:
        data = body if isinstance(body, bytes | str) else json.dumps(body)
        async with self.session.post(
            f"{self.url}/{verb}", data=data, headers={"Content-Type": "application/json"}
        ) as r:
            text = await r.text()
            return r.status, json.loads(text) if text else None

    async def filter(self, pod: Mapping[str, Any], nodes: Sequence[Any]) -> dict[str, Any]:
        status, result = await self.post("filter", self.filter_args(pod, nodes))
        assert status == 200, (status, result)
        return result

    async def bind(self, pod: Mapping[str, Any], node: str) -> dict[str, Any]:
        meta = pod["metadata"]
        body = {
            "PodName": meta["name"],
            "PodNamespace": meta["namespace"],
            "PodUID": meta["uid"],
            "Node": node,
        }
        status, result = await self.post("bind", body)
        assert status == 200, (status, result)
        return result

    @staticmethod
    def chosen(result: Mapping[str, Any]) -> list[str]:
        """The passing node names of a filter result in either cache mode."""
        if result.get("NodeNames") is not None:
            return list(result["NodeNames"])
        if result.get("Nodes") is not None:
            return [n["metadata"]["name"] for n in result["Nodes"]["items"]]
        return []


def create_pod(api: FakeApiServer, pod: Mapping[str, Any]) -> dict[str, Any]:
    """Store a pod (status Pending); returns it with uid and resourceVersion."""
    obj = copy.deepcopy(dict(pod))
    obj.setdefault("status", {"phase": "Pending"})
    return api.store.create("pods", obj)


def dp_allocated(api: FakeApiServer, pod: Mapping[str, Any], node: str) -> None:
    """What the device plugin does after Allocate: bind-phase success, to-allocate emptied, lock released."""
    meta = pod["metadata"]
    current = api.store.get("pods", meta["name"], namespace=meta["namespace"]) or {}
    value = (current.get("metadata", {}).get("annotations") or {}).get(A.NVIDIA_TO_ALLOCATE, "")
    emptied = ";" * value.count(";")
    api.store.patch(
        "pods",
        meta["name"],
        {"metadata": {"annotations": {A.BIND_PHASE: "success", A.NVIDIA_TO_ALLOCATE: emptied}}},
        namespace=meta["namespace"],
    )
    # Only its own lock (HAMi's ReleaseNodeLock checks the owner): the extender may already have taken
    # over a lock whose owner reached bind-phase success, and that lock is the next pod's now.
    while True:
        current_node = api.store.get("nodes", node)
        lock = (current_node["metadata"].get("annotations") or {}).get(A.NODE_LOCK)
        if lock is None or ("," in lock and not lock.endswith(f",{meta['namespace']},{meta['name']}")):
            return
        del current_node["metadata"]["annotations"][A.NODE_LOCK]
        try:
            api.store.update("nodes", current_node)  # the resourceVersion check: never a newer lock
            return
        except ApiStatusError as e:
            if e.code != 409:
                raise
