"""The real plugin (fake backend) against the fake kubelet: registration, ListAndWatch, restarts, health."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from device_plugin.app import DevicePluginApp, PluginOptions
from device_plugin.backends.fake import FakeBackend
from kubefakes.kubelet import FakeKubelet

RESOURCE = "nvidia.com/gpu"
CARDS = [
    {"uuid": "GPU-aaaa", "index": 0, "model": "Tesla V100-PCIE-32GB", "memory_mib": 32768, "numa": 0},
    {"uuid": "GPU-bbbb", "index": 1, "model": "Tesla V100-PCIE-32GB", "memory_mib": 32768, "numa": 1},
]


def write_cards(path: Path, cards: list[dict]) -> None:
    # Write-then-rename, as an editor would: the backend never sees a half-written file.
    tmp = path.with_suffix(".tmp")
    tmp.write_text(yaml.safe_dump({"cards": cards}))
    os.replace(tmp, path)


@pytest.fixture
def cards_file(tmp_path):
    path = tmp_path / "cards.yaml"
    write_cards(path, CARDS)
    return path


@pytest.fixture
async def kubelet(tmp_path):
    k = FakeKubelet(tmp_path / "device-plugins")
    await k.start()
    yield k
    await k.stop()


async def start_plugin(kubelet: FakeKubelet, cards_file: Path, **kw) -> DevicePluginApp:
    app = DevicePluginApp(
        PluginOptions(node_name="node1", socket_dir=str(kubelet.socket_dir), **kw),
        FakeBackend(cards_file, poll_s=0.05),
    )
    await app.start()
    return app


async def test_registers_and_answers_options_both_ways(kubelet, cards_file):
    app = await start_plugin(kubelet, cards_file)
    try:
        ep = await kubelet.wait_registered(RESOURCE)
        req = kubelet.register_requests[0]
        assert (req.version, req.endpoint, req.resource_name) == ("v1beta1", "nvidia-gpu.sock", RESOURCE)
        # The same options in the request (kubelet < 1.25) and from the callback (>= 1.25).
        assert req.options.get_preferred_allocation_available is True
        assert req.options.pre_start_required is False
        assert kubelet.options_calls == 1
        assert ep.options == req.options
        assert ep.socket == kubelet.socket_dir / "nvidia-gpu.sock"
        assert app.registration.registered
    finally:
        await app.stop()
    assert not (kubelet.socket_dir / "nvidia-gpu.sock").exists()


async def test_legacy_kubelet_takes_options_from_the_request(tmp_path, cards_file):
    kubelet = FakeKubelet(tmp_path / "dp", sync_options=False)
    await kubelet.start()
    app = await start_plugin(kubelet, cards_file)
    try:
        ep = await kubelet.wait_registered(RESOURCE)
        assert kubelet.options_calls == 0
        assert ep.options.get_preferred_allocation_available is True
    finally:
        await app.stop()
        await kubelet.stop()


async def test_list_and_watch_full_list_of_virtual_devices(kubelet, cards_file):
    app = await start_plugin(kubelet, cards_file)
    try:
        ep = await kubelet.wait_registered(RESOURCE)
        assert sorted(ep.devices) == [f"GPU-aaaa-{i}" for i in range(10)] + [
            f"GPU-bbbb-{i}" for i in range(10)
        ]
        assert {d.health for d in ep.devices.values()} == {"Healthy"}
        # enableNumaTopology is off by default (as in HAMi): no TopologyInfo.
        assert not any(d.HasField("topology") for d in ep.devices.values())
    finally:
        await app.stop()


async def test_numa_topology_and_split_count_from_device_config(kubelet, cards_file):
    from hami.config import load_config

    config = load_config(
        {
            "nvidia": {"deviceSplitCount": 4, "enableNumaTopology": True},
            "nodeconfig": [{"name": "node1", "devicesplitcount": 2}],
        }
    )
    app = await start_plugin(kubelet, cards_file, config=config)
    try:
        ep = await kubelet.wait_registered(RESOURCE)
        got = sorted((d.ID, [n.ID for n in d.topology.nodes]) for d in ep.devices.values())
        assert got == [
            ("GPU-aaaa-0", [0]), ("GPU-aaaa-1", [0]), ("GPU-bbbb-0", [1]), ("GPU-bbbb-1", [1]),
        ]  # fmt: skip
    finally:
        await app.stop()


async def test_kubelet_restart_re_registers_within_5_seconds(kubelet, cards_file):
    app = await start_plugin(kubelet, cards_file)
    try:
        await kubelet.wait_registered(RESOURCE)
        await kubelet.restart()
        assert not kubelet.endpoints[RESOURCE].healthy()  # until we are back, allocatable is 0
        started = time.monotonic()
        ep = await kubelet.wait_registered(RESOURCE, count=2, timeout=5.0)
        assert time.monotonic() - started < 5.0
        assert len(ep.healthy()) == 20
        assert (kubelet.socket_dir / "nvidia-gpu.sock").exists()
        assert app.registration.registrations == 2
        # and again: each restart is handled, not just the first
        await kubelet.restart()
        await kubelet.wait_registered(RESOURCE, count=3, timeout=5.0)
    finally:
        await app.stop()


async def test_plugin_started_before_kubelet_registers_when_it_appears(tmp_path, cards_file):
    kubelet = FakeKubelet(tmp_path / "dp")
    (tmp_path / "dp").mkdir()
    app = await start_plugin(kubelet, cards_file)
    try:
        await asyncio.sleep(0.3)
        assert not app.registration.registered
        await kubelet.start()
        await kubelet.wait_registered(RESOURCE, timeout=5.0)
    finally:
        await app.stop()
        await kubelet.stop()


async def test_unhealthy_card_updates_list_and_watch_and_recovers(kubelet, cards_file):
    app = await start_plugin(kubelet, cards_file, metrics_port=0, metrics_host="127.0.0.1")
    try:
        ep = await kubelet.wait_registered(RESOURCE)
        before = ep.snapshots
        write_cards(cards_file, [CARDS[0], {**CARDS[1], "healthy": False}])
        await kubelet.wait_for(lambda: len(ep.unhealthy()) == 10, timeout=5)
        assert ep.unhealthy() == {f"GPU-bbbb-{i}" for i in range(10)}
        assert len(ep.devices) == 20  # every message is the full list
        assert ep.snapshots == before + 1
        import aiohttp

        async with aiohttp.ClientSession() as s, s.get(app.metrics_url) as r:
            text = await r.text()
        assert 'hami_device_plugin_card_healthy{index="1",uuid="GPU-bbbb"} 0.0' in text
        assert 'hami_device_plugin_devices{health="Unhealthy"} 10.0' in text
        assert "hami_device_plugin_registered 1.0" in text
        write_cards(cards_file, CARDS)
        await kubelet.wait_for(lambda: len(ep.healthy()) == 20, timeout=5)
    finally:
        await app.stop()


async def test_without_api_server_allocate_refuses_with_reason(kubelet, cards_file):
    app = await start_plugin(kubelet, cards_file)
    try:
        await kubelet.wait_registered(RESOURCE)
        from kubefakes.kubelet import AdmissionError

        with pytest.raises(AdmissionError, match="runs without an API server connection"):
            await kubelet.admit_container(RESOURCE, 1)
    finally:
        await app.stop()


async def test_console_entry_point_registers(kubelet, cards_file):
    proc = subprocess.Popen(
        [sys.executable, "-m", "device_plugin", "--backend", "fake", "--fake-config", str(cards_file),
         "--node-name", "node1", "--socket-dir", str(kubelet.socket_dir), "--no-kube", "--metrics-port", "-1"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        ep = await kubelet.wait_registered(RESOURCE, timeout=20)
        assert len(ep.healthy()) == 20
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=10)
    assert proc.returncode == 0, out
    assert "registered nvidia.com/gpu with kubelet" in out
