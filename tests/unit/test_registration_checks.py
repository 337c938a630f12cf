"""A node registration that lists one card twice, one index twice, or a card without memory is malformed.

Found trying a user report on the landed code: a registration that listed one UUID twice was accepted,
and a ``nvidia.com/gpu: 2`` container got the same card twice (60000 MiB booked on a 40000 MiB card).
Such a node is unusable with the reason logged, like any other malformed registration.
"""

from __future__ import annotations

import logging

import pytest

from hami.cluster import ClusterState
from hami.errors import AnnotationError
from hami.model import Device
from hami.registration import (
    decode_node_devices_colon,
    decode_node_devices_json,
    encode_node_devices_colon,
    encode_node_devices_json,
)
from tests.builders import V100, ctr, node, pod

CARD = "GPU-00552014-5c87-89ac-b1a6-7b53aa24b0ec"


def card(uuid: str = CARD, index: int = 0, mem: int = 40000) -> Device:
    return Device(uuid, index, 10, mem, 100, V100, 0, health=True)


def test_one_uuid_twice_makes_the_node_unusable_and_no_pod_gets_the_card_twice(caplog):
    cs = ClusterState()
    with caplog.at_level(logging.WARNING, logger="hami.cluster"):
        reason = cs.upsert_node(node("n", [card(index=0), card(index=1)]))
    assert reason == (
        f"hami.io/node-nvidia-register: devices 0 and 1 both have id {CARD!r}; every card must be listed once"
    )
    assert f"node n: malformed registration, node unusable: {reason}" in caplog.text
    out = cs.filter(pod(ctr(gpu=2, mem=30000, cores=0)), ["n"])
    assert out.node is None
    assert out.failed_nodes == {"n": reason}
    assert cs.usage_snapshot() == {"n": {}}


def test_one_index_twice_is_malformed():
    value = encode_node_devices_json([card("GPU-a", 3), card("GPU-b", 3)])
    with pytest.raises(AnnotationError) as e:
        decode_node_devices_json(value)
    assert str(e.value) == "devices 0 (GPU-a) and 1 (GPU-b) both have index 3; every card needs its own index"


@pytest.mark.parametrize("mem, shown", [(0, "0"), (-1, "-1")])
def test_zero_or_negative_memory_is_malformed_in_both_forms(mem, shown):
    devices = [card("GPU-a", 0), card("GPU-b", 1, mem=mem)]
    with pytest.raises(AnnotationError) as e:
        decode_node_devices_json(encode_node_devices_json(devices))
    want = {"0": "device 1 (GPU-b): field 'devmem' must be > 0 MiB, got 0",
            "-1": "device 1 (GPU-b): field 'devmem' must be >= 0, got -1"}[shown]  # fmt: skip
    assert str(e.value) == want
    colon = encode_node_devices_colon(devices)
    with pytest.raises(AnnotationError) as e:
        decode_node_devices_colon(colon, vendor="HYGON")
    want = {"0": "device 1 (GPU-b): field 'devmem' must be > 0 MiB, got 0",
            "-1": "device 1: field 'devmem' must be >= 0, got -1"}[shown]  # fmt: skip
    assert str(e.value) == want


def test_colon_form_rejects_a_uuid_twice():
    colon = encode_node_devices_colon([card("GPU-a", 0), card("GPU-a", 1)])
    with pytest.raises(AnnotationError, match=r"^devices 0 and 1 both have id 'GPU-a'; every card must be listed once$"):
        decode_node_devices_colon(colon, vendor="HYGON")


def test_a_valid_registration_still_decodes_unchanged():
    devices = [card("GPU-a", 0), card("GPU-b", 1, mem=1)]
    assert decode_node_devices_json(encode_node_devices_json(devices)) == devices


def test_the_node_recovers_when_the_plugin_fixes_its_registration():
    cs = ClusterState()
    assert cs.upsert_node(node("n", [card(index=0), card(index=1)])) is not None
    assert cs.upsert_node(node("n", [card(index=0), card("GPU-other", 1)])) is None
    out = cs.filter(pod(ctr(gpu=2, mem=30000, cores=0)), ["n"])
    assert out.node == "n"
    assert sorted(cs.usage_snapshot()["n"]) == sorted([CARD, "GPU-other"])
