"""A tenant writes its own region file: the monitor exports no figure its card cannot hold.

The monitor runs as its own process against the in-memory API server (the fixtures of
`tests.integration.test_monitor`), reading region files written byte for byte from the documented
layout.
"""

from __future__ import annotations

import os
import uuid

from tests.integration.test_monitor import SCAN_S, create_pod, value, wait_for
from tests.integration.test_monitor import monitor_factory as monitor_factory  # noqa: F401 - the fixture
from tests.unit.monitor_files import UNLIMITED, VDev, VSlot, libvgpu_bytes, write

MIB = 1 << 20
CARD = "GPU-11111111-2222-3333-4444-555555555555"
OTHER = "GPU-99999999-2222-3333-4444-555555555555"  # not reported by the host backend


def test_values_outside_the_cards_capacity_are_dropped_and_counted(kube_client, monitor_factory, tmp_path):
    containers = tmp_path / "containers"
    me = os.getpid()  # the slot's process: alive
    honest = create_pod(kube_client, "honest", "team-a", ["main"])
    liar = create_pod(kube_client, "liar", "team-a", ["main"])
    unknown = create_pod(kube_client, "elsewhere", "team-a", ["main"])
    write(
        containers / f"{honest}_main" / f"{uuid.uuid4()}.cache",
        libvgpu_bytes([VDev(CARD, limit=4000 * MIB)], [VSlot(me, used=[1000 * MIB], data=[1000 * MIB])]),
    )
    # 2^64-1 bytes used on a 40000 MiB card, and a limit above the card on a second device.
    write(
        containers / f"{liar}_main" / f"{uuid.uuid4()}.cache",
        libvgpu_bytes(
            [VDev(CARD, limit=UNLIMITED), VDev(CARD, limit=80000 * MIB)],
            [VSlot(me, used=[(1 << 64) - 1, 10 * MIB], data=[0, 10 * MIB])],
        ),
    )
    # A card the host backend does not know: still bounded.
    write(
        containers / f"{unknown}_main" / f"{uuid.uuid4()}.cache",
        libvgpu_bytes([VDev(OTHER, limit=UNLIMITED)], [VSlot(me, used=[(1 << 63)], data=[0])]),
    )
    cards = tmp_path / "cards.yaml"
    cards.write_text(f"cards:\n  - {{uuid: {CARD}, index: 0, model: NVIDIA A100, memory_mib: 40000}}\n")
    port = monitor_factory(containers, cards=str(cards))

    ok = {
        "namespace": "team-a",
        "pod": "honest",
        "container": "main",
        "vdevice_index": "0",
        "device_uuid": CARD,
    }
    got = wait_for(
        port, lambda g: value(g, "hami_vgpu_memory_used_bytes", **ok) is not None, what="honest series"
    )
    assert value(got, "hami_vgpu_memory_used_bytes", **ok) == 1000 * MIB
    got = wait_for(
        port,
        lambda g: value(g, "hami_monitor_cache_errors_total", reason="out_of_range") == 2,
        what="2 errors",
    )
    bad = {**ok, "pod": "liar"}
    assert value(got, "hami_vgpu_memory_used_bytes", **bad) is None
    assert value(got, "hami_vgpu_memory_used_bytes", **{**bad, "vdevice_index": "1"}) is None
    assert value(got, "hami_vgpu_memory_used_bytes", pod="elsewhere") is None
    # Counted once per file entering the state, not once per scan.
    since = value(got, "hami_monitor_last_scan_timestamp_seconds")
    got = wait_for(
        port,
        lambda g: value(g, "hami_monitor_last_scan_timestamp_seconds") > since + 3 * SCAN_S,
        what="3 more scans",
    )
    assert value(got, "hami_monitor_cache_errors_total", reason="out_of_range") == 2
