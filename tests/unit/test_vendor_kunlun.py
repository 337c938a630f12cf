"""Kunlunxin: whole XPUs on the 8-card board rule, vXPU memory templates."""

import pytest

from hami.vendors.kunlun import KunlunVendor, XPUVendor, board_select, trim_memory
from tests.vendor_fleet import container, fleet, place, pod, state

KUN, XPU = KunlunVendor(), XPUVendor()
KNODE, XNODE = fleet()["kunlun"], fleet()["XPU"]


def test_whole_xpu_inventory():
    devs = KUN.node_devices(KNODE)
    assert [d.numa for d in devs] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert {(d.count, d.devmem, d.devcore) for d in devs} == {(100, 98304, 100)}


@pytest.mark.parametrize(("free", "nums", "chosen"), [
    (set(range(8)), 2, [0, 1]),          # idle board: left wing, first cards
    ({0, 4, 5, 6, 7}, 1, [0]),           # the wing with exactly one free card first (packs)
    ({1, 2, 3, 4, 5, 6, 7}, 2, [1, 2]),  # no wing has exactly 2; the left wing (3 free) before the right (4)
    ({0, 4}, 2, [0, 4]),                 # no wing has 2: the interconnect pair
    ({0, 1, 4, 5}, 4, [0, 1, 4, 5]),     # no wing has 4: the first quad
    ({0, 1, 2, 3, 4, 5, 6}, 8, None),
    (set(range(8)), 3, None),            # 3 never fits the board
], ids=["idle-2", "pack-1", "wing-3", "pair", "quad", "eight-busy", "three"])  # fmt: skip
def test_board_select(free, nums, chosen):
    assert board_select(free, nums) == chosen


def test_whole_xpu_filter_worked_example_and_reasons():
    st = state(KNODE)
    a = st.filter(pod("p", container("c", {"kunlunxin.com/xpu": 2})), ["k1"]).annotations
    assert a["hami.io/kunlun-allocated"] == "k1-kunlun-0,kunlun,98304,100:k1-kunlun-1,kunlun,98304,100:;"
    assert a["BAIDU_COM_DEVICE_IDX"] == "0,1"
    assert (
        st.filter(pod("q", container("c", {"kunlunxin.com/xpu": 8})), ["k1"]).failed_nodes["k1"]
        == "1/8 NumaNotFit"
    )
    excluded = pod(
        "u",
        container("c", {"kunlunxin.com/xpu": 1}),
        annotations={"baidu.com/nouse-gpuuuid": ",".join(f"k1-kunlun-{i}" for i in range(8))},
    )
    assert place(excluded, KNODE).failed_nodes["k1"] == "8/8 CardUuidMismatch"


@pytest.mark.parametrize(
    ("mib", "template"), [(0, 24576), (20000, 24576), (24577, 49152), (60000, 98304), (200000, 98304)]
)
def test_vxpu_templates(mib, template):
    assert trim_memory(mib) == template


def test_vxpu_webhook_and_filter_worked_example():
    c = container("c", {"kunlunxin.com/vxpu": 1, "kunlunxin.com/vxpu-memory": 20000})
    assert XPU.mutate_container(c, pod={}).uses_device
    assert c["resources"]["limits"]["kunlunxin.com/vxpu-memory"] == "24576"
    assert c["resources"]["requests"]["kunlunxin.com/vxpu-memory"] == "24576"
    a = place(pod("p", c), XNODE).annotations
    assert a["hami.io/xpu-devices-to-allocate"] == "0000:1a:00.0,XPU,24576,25:;"


def test_vxpu_only_equal_slices_share_a_card():
    st = state(XNODE)
    small = {"kunlunxin.com/vxpu": 1, "kunlunxin.com/vxpu-memory": 24576}
    for i in range(4):
        assert (
            st.filter(pod(f"s{i}", container("c", small)), ["x1"]).annotations[
                "hami.io/xpu-devices-allocated"
            ]
            == "0000:1a:00.0,XPU,24576,25:;"
        )
    big = pod("b", container("c", {"kunlunxin.com/vxpu": 1, "kunlunxin.com/vxpu-memory": 49152}))
    # Card 0 is full; the board rule packs into the left wing's next card.
    assert (
        st.filter(big, ["x1"]).annotations["hami.io/xpu-devices-allocated"] == "0000:1b:00.0,XPU,49152,50:;"
    )
    mixed = pod("m", container("c", small), annotations={"hami.io/use-xpu-uuid": "0000:1b:00.0"})
    assert st.filter(mixed, ["x1"]).failed_nodes["x1"] == "7/8 CardUuidMismatch"
