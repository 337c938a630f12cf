"""Moore Threads: capacity inventory, 512 MiB units split per card, webhook whole cards, pod-level index."""

import pytest

from hami.errors import InvalidRequest
from hami.vendors.mthreads import MthreadsVendor
from tests.vendor_fleet import container, fleet, node, place, pod

MT = MthreadsVendor()
NODE = fleet()["Mthreads"]


def test_inventory_worked_example():
    devs = MT.node_devices(NODE)
    assert [(d.uuid, d.count, d.devmem, d.devcore) for d in devs] == [
        ("mt-1-mthreads-0", 100, 49152, 16),
        ("mt-1-mthreads-1", 100, 49152, 16),
    ]


def test_filter_worked_example():
    p = pod(
        "p",
        container("c", {"mthreads.com/vgpu": 1, "mthreads.com/sgpu-memory": 8, "mthreads.com/sgpu-core": 4}),
        annotations={"mthreads.ai/use-gpuuuid": "mt-1-mthreads-1"},
    )
    a = place(p, NODE, now=1_700_000_000).annotations
    assert a["hami.io/mthreads-vgpu-devices-allocated"] == "mt-1-mthreads-1,Mthreads,4096,4:;"
    assert a["mthreads.com/gpu-index"] == "1"
    assert a["mthreads.com/predicate-node"] == "mt-1"
    assert a["mthreads.com/predicate-time"] == "1700000000000000000"
    assert "hami.io/mthreads-vgpu-devices-to-allocate" not in a
    assert MT.uses_node_lock is False


def test_webhook_multi_card_becomes_whole_cards_and_request_splits_per_card():
    p: dict = {"metadata": {}}
    c = container("c", {"mthreads.com/vgpu": 2})
    assert MT.mutate_container(c, pod=p).uses_device
    assert c["resources"]["limits"] == {
        "mthreads.com/vgpu": "2",
        "mthreads.com/sgpu-core": "32",
        "mthreads.com/sgpu-memory": "192",
    }
    assert p["metadata"]["annotations"] == {"mthreads.com/request-gpu-num": "2"}
    r = MT.container_request(c)
    assert (r.nums, r.memreq, r.coresreq) == (2, 49152, 16)
    bare = container("c", {"mthreads.com/vgpu": 1})
    MT.mutate_container(bare, pod={})
    assert bare["resources"]["limits"]["mthreads.com/sgpu-memory"] == "96"


@pytest.mark.parametrize(("limits", "message"), [
    ({"mthreads.com/vgpu": 1, "mthreads.com/sgpu-memory": 3}, r"sGPU memory request value is invalid, valid values are \[2, 4, 8, 16, 32, 64, 96\]"),
    ({"mthreads.com/vgpu": 0}, "mthreads.com/vgpu must be greater than 0"),
], ids=["illegal-memory", "zero-count"])  # fmt: skip
def test_webhook_rejections(limits, message):
    with pytest.raises(InvalidRequest, match=message):
        MT.mutate_container(container("c", limits), pod={})


def test_whole_card_fills_a_card_and_gpu_index_lists_the_last_container():
    two = pod(
        "p",
        container("a", {"mthreads.com/vgpu": 1, "mthreads.com/sgpu-memory": 2, "mthreads.com/sgpu-core": 1}),
        container("b", {"mthreads.com/vgpu": 1, "mthreads.com/sgpu-memory": 2, "mthreads.com/sgpu-core": 1}),
    )
    a = place(two, NODE).annotations
    # Same-card rule: the second container shares the first one's card.
    assert (
        a["hami.io/mthreads-vgpu-devices-allocated"]
        == "mt-1-mthreads-0,Mthreads,1024,1:;mt-1-mthreads-0,Mthreads,1024,1:;"
    )
    assert a["mthreads.com/gpu-index"] == "0"
    small = node("mt-s", capacity={"mthreads.com/sgpu-core": "16", "mthreads.com/sgpu-memory": "64"})
    whole = pod(
        "w",
        container(
            "c", {"mthreads.com/vgpu": 1, "mthreads.com/sgpu-memory": 96, "mthreads.com/sgpu-core": 16}
        ),
    )
    assert place(whole, small).failed_nodes["mt-s"] == "1/1 CardInsufficientMemory"
