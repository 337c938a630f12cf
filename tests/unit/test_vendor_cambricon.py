"""Cambricon MLU: capacity inventory, 256 MiB units, profile annotations (HAMi's worked examples)."""

import pytest

from hami.vendors.cambricon import CambriconVendor
from tests.vendor_fleet import container, fleet, node, place, pod, state

MLU = CambriconVendor()
NODE = fleet()["MLU"]


def test_inventory_from_capacity():
    devs = MLU.node_devices(NODE)
    assert [d.uuid for d in devs] == [f"mlu-a-cambricon-mlu-{i}" for i in range(4)]
    assert {(d.count, d.devmem, d.devcore, d.type) for d in devs} == {(100, 24576, 100, "MLU")}
    # A non-multiple of 100 rounds the card count up, memory computed against the real total.
    odd = MLU.node_devices(
        node("m", capacity={"cambricon.com/mlu.smlu.vcore": "250", "cambricon.com/mlu.smlu.vmemory": "384"})
    )
    assert len(odd) == 3 and odd[0].devmem == 384 * 256 * 100 // 250
    assert MLU.node_devices(node("plain")) is None


def test_malformed_capacity_marks_the_node_unusable():
    st = state()
    why = st.upsert_node(node("bad", capacity={"cambricon.com/mlu.smlu.vcore": "4.5"}))
    assert why is not None and why.startswith("MLU inventory: status.capacity[cambricon.com/mlu.smlu.vcore]")


@pytest.mark.parametrize(
    ("limits", "expected"),
    [
        (
            {
                "cambricon.com/vmlu": 1,
                "cambricon.com/mlu.smlu.vmemory": 20,
                "cambricon.com/mlu.smlu.vcore": 30,
            },
            (1, 5120, 101, 30),
        ),
        ({"cambricon.com/vmlu": 1}, (1, 0, 100, 100)),  # whole card: all memory, exclusive cores
    ],
    ids=["share", "bare-count"],
)
def test_requests(limits, expected):
    r = MLU.container_request(container("c", limits))
    assert (r.nums, r.memreq, r.mem_percentage, r.coresreq) == expected


def test_filter_writes_profile_and_both_assigned_spellings():
    p = pod(
        "p",
        container(
            "c",
            {
                "cambricon.com/vmlu": 1,
                "cambricon.com/mlu.smlu.vmemory": 20,
                "cambricon.com/mlu.smlu.vcore": 30,
            },
        ),
        annotations={"cambricon.com/use-gpuuuid": "mlu-a-cambricon-mlu-2"},
    )
    out = place(p, NODE)
    a = out.annotations
    assert a["hami.io/cambricon-mlu-devices-to-allocate"] == "mlu-a-cambricon-mlu-2,MLU,5120,30:;"
    assert a["hami.io/cambricon-mlu-devices-allocated"] == "mlu-a-cambricon-mlu-2,MLU,5120,30:;"
    assert a["CAMBRICON_DSMLU_PROFILE"] == "2_30_20"
    assert a["CAMBRICON_DSMLU_ASSIGNED"] == a["CAMBRICON_DSMLU_ASSIGHED"] == "false"


def test_memoryless_request_takes_the_whole_card():
    p = pod(
        "p",
        container("c", {"cambricon.com/vmlu": 1}),
        annotations={"cambricon.com/use-gpuuuid": "mlu-a-cambricon-mlu-2"},
    )
    a = place(p, NODE).annotations
    assert a["hami.io/cambricon-mlu-devices-to-allocate"] == "mlu-a-cambricon-mlu-2,MLU,24576,100:;"
    assert a["CAMBRICON_DSMLU_PROFILE"] == "2_100_96"


def test_fit_reasons_memory_and_uuid():
    big = pod("p", container("c", {"cambricon.com/vmlu": 1, "cambricon.com/mlu.smlu.vmemory": 97}))
    assert place(big, NODE).failed_nodes["mlu-a"] == "4/4 CardInsufficientMemory"
    nouse = pod(
        "q",
        container("c", {"cambricon.com/vmlu": 1}),
        annotations={"cambricon.com/nouse-gpuuuid": ",".join(f"mlu-a-cambricon-mlu-{i}" for i in range(4))},
    )
    assert place(nouse, NODE).failed_nodes["mlu-a"] == "4/4 CardUuidMismatch"


def test_no_node_lock_and_webhook_found_only_from_limits():
    assert MLU.uses_node_lock is False
    assert MLU.mutate_container(container("c", {"cambricon.com/vmlu": 1}), pod={}).uses_device
    only_requests = {"name": "c", "resources": {"requests": {"cambricon.com/vmlu": "1"}}}
    assert not MLU.mutate_container(only_requests, pod={}).uses_device
