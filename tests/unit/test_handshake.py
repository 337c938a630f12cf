"""hami.handshake.check_node: HAMi's handshake health check without the user-reported failure modes
(user bug log R01: a stale ``Deleted_`` kept nodes out; R02: a late answer must not drop a live node)."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest

from hami import annotations as A
from hami.handshake import check_node
from hami.model import Device
from hami.registration import encode_node_devices_json
from hami.vendors import build_vendors

NOW = datetime(2026, 11, 29, 12, 0, 0)
VENDORS = list(build_vendors().values())
REG = encode_node_devices_json([Device("GPU-a", 0, 10, 32768, 100, "NVIDIA-Tesla V100-PCIE-32GB")])
STAMP = "Requesting_2026-11-29 12:00:00"


def node(handshake: str | None, allocatable: str | None = "10", *, register: str | None = REG) -> dict:
    annos = {}
    if register is not None:
        annos[A.NVIDIA_REGISTER] = register
    if handshake is not None:
        annos[A.NVIDIA_HANDSHAKE] = handshake
    status = {"allocatable": {"nvidia.com/gpu": allocatable}} if allocatable is not None else {}
    return {"metadata": {"name": "n1", "annotations": annos}, "status": status}


@pytest.mark.parametrize(
    "handshake",
    [None, "Reported_2026-11-29 11:00:00", "Deleted_2024-01-01 00:00:00", "garbage", "Requesting_not-a-time"],
)
def test_non_requesting_values_never_keep_a_node_out_and_get_a_fresh_stamp(handshake: str | None) -> None:
    for alloc in ("10", None):
        verdict = check_node(node(handshake, alloc), VENDORS, now=NOW)
        assert verdict.usable and verdict.reason is None
        assert verdict.stamps == {A.NVIDIA_HANDSHAKE: STAMP}


def test_fresh_requesting_stamp_is_healthy_and_not_rewritten() -> None:
    verdict = check_node(node("Requesting_2026-11-29 11:59:30", None), VENDORS, now=NOW)
    assert verdict.usable and verdict.stamps == {}


def test_unanswered_stamp_with_allocatable_devices_keeps_the_node() -> None:
    verdict = check_node(node("Requesting_2026-11-29 11:50:00", "10"), VENDORS, now=NOW)
    assert verdict.usable and verdict.stamps == {}


def test_unanswered_stamp_without_allocatable_makes_the_node_unusable() -> None:
    verdict = check_node(node("Requesting_2026-11-29 11:58:59", None), VENDORS, now=NOW)
    assert not verdict.usable
    assert verdict.reason == (
        "device plugin did not answer hami.io/node-handshake=Requesting_2026-11-29 11:58:59 for 61 s and "
        "kubelet advertises no nvidia.com/gpu (check the device plugin pod on this node)"
    )


def test_timeout_is_a_parameter() -> None:
    n = node("Requesting_2026-11-29 11:58:59", None)
    assert check_node(n, VENDORS, now=NOW, timeout_s=120).usable
    assert not check_node(n, VENDORS, now=NOW + timedelta(seconds=60), timeout_s=120).usable


def test_kubelet_advertising_zero_devices_makes_the_node_unusable() -> None:
    verdict = check_node(node("Requesting_2026-11-29 12:00:00", "0"), VENDORS, now=NOW)
    assert verdict.reason == (
        "kubelet advertises nvidia.com/gpu: 0 (device plugin not running or every card unhealthy; check the "
        "device plugin pod on this node)"
    )


def test_stamp_in_the_future_counts_as_fresh() -> None:
    assert check_node(node("Requesting_2026-11-29 12:05:00", None), VENDORS, now=NOW).usable


def test_nodes_without_a_registration_are_not_judged() -> None:
    verdict = check_node(node("Deleted_x", "0", register=None), VENDORS, now=NOW)
    assert verdict.usable and verdict.stamps == {}


def test_each_vendor_uses_its_own_handshake_key() -> None:
    colon = "DCU-1,4,16368,100,DCU-Z100,0,true,0,hami-core:"
    n = {
        "metadata": {
            "annotations": {"hami.io/node-dcu-register": colon, "hami.io/node-handshake-dcu": "Reported_x"}
        },
        "status": {"allocatable": {"hygon.com/dcunum": "4"}},
    }
    verdict = check_node(n, VENDORS, now=NOW)
    assert verdict.usable and verdict.stamps == {"hami.io/node-handshake-dcu": STAMP}
