"""The webhook with API access (`--kubeconfig`): quota limits and namespace labels come from watches of
the in-memory API server through the official client, and a review makes no API call."""

from __future__ import annotations

import asyncio
import json
import ssl
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import pytest

from kubefakes.apiserver import FakeApiServer
from webhook import cli
from webhook.devcerts import make_ca, make_server_cert, write_pair

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "webhook"


@pytest.fixture
def api() -> Iterator[FakeApiServer]:
    server = FakeApiServer(bookmark_interval_s=0.2).start()
    server.store.create("namespaces", {"metadata": {"name": "ml"}})
    server.store.create(
        "namespaces", {"metadata": {"name": "batch", "labels": {"hami.io/webhook": "ignore"}}}
    )
    server.store.create(
        "resourcequotas",
        {
            "metadata": {"name": "gpu", "namespace": "ml"},
            "spec": {"hard": {"limits.nvidia.com/gpumem": "4000"}},
        },
    )
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
async def webhook(api: FakeApiServer, tmp_path: Path) -> AsyncIterator[tuple[str, aiohttp.ClientSession]]:
    ca = make_ca()
    cert, key = write_pair(tmp_path, *make_server_cert(ca))
    args = cli.parse_args(["--tls-cert-file", str(cert), "--tls-private-key-file", str(key), "--address",
                           "127.0.0.1", "--port", "0", "--kubeconfig", str(api.kubeconfig_path)])  # fmt: skip
    running = await cli.start(args)
    connector = aiohttp.TCPConnector(ssl=ssl.create_default_context(cadata=ca.cert_pem.decode()))
    try:
        async with aiohttp.ClientSession(connector=connector) as session:
            yield f"https://127.0.0.1:{running.port}/mutate", session
    finally:
        await running.stop()


async def review(webhook: tuple[str, aiohttp.ClientSession], case: str) -> dict:
    url, session = webhook
    request = json.loads((GOLDEN / f"{case}.json").read_text())["request"]
    async with session.post(url, json=request) as resp:
        assert resp.status == 200
        return (await resp.json())["response"]


async def eventually(check, timeout_s: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not await check():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached"
        await asyncio.sleep(0.05)


async def test_quota_from_watch_and_no_api_call_per_review(webhook, api: FakeApiServer) -> None:
    # Two lists, then two watches are open; from then on nothing but the watches talks to the API.
    async def watching() -> bool:
        return api.request_count >= 4

    await eventually(watching)
    before = api.request_count
    # 2 x 3000 MiB > limits.nvidia.com/gpumem 4000 of namespace ml.
    denied = await review(webhook, "deny-quota-memory")
    assert denied["allowed"] is False
    assert denied["status"]["message"] == (
        "exceeding resource quota: namespace ml: the pod needs 6000 MiB of nvidia.com/gpumem but the "
        "ResourceQuota limit limits.nvidia.com/gpumem is 4000"
    )
    for _ in range(5):
        assert (await review(webhook, "quota-fits"))["allowed"] is True
    assert api.request_count == before  # reviews read the cache only

    api.store.patch(
        "resourcequotas", "gpu", {"spec": {"hard": {"limits.nvidia.com/gpumem": "8000"}}}, namespace="ml"
    )

    async def admitted() -> bool:
        return (await review(webhook, "deny-quota-memory"))["allowed"] is True

    await eventually(admitted)
    api.store.patch(
        "resourcequotas", "gpu", {"spec": {"hard": {"limits.nvidia.com/gpumem": "1000"}}}, namespace="ml"
    )

    async def denied_again() -> bool:
        return (await review(webhook, "quota-fits"))["allowed"] is False

    await eventually(denied_again)
    api.store.delete("resourcequotas", "gpu", namespace="ml")

    async def no_quota() -> bool:
        return (await review(webhook, "quota-fits"))["allowed"] is True

    await eventually(no_quota)


async def test_namespace_label_from_watch(webhook, api: FakeApiServer) -> None:
    assert await review(webhook, "ignore-label-namespace") == {
        "uid": "0000-0024-ignore-label-namespace",
        "allowed": True,
    }
    api.store.patch("namespaces", "batch", {"metadata": {"labels": {"hami.io/webhook": None}}})

    async def mutated() -> bool:
        return "patch" in await review(webhook, "ignore-label-namespace")

    await eventually(mutated)
