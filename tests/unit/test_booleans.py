"""hami.booleans against the shared truth table file (the same file libvgpu's C header is tested
against in tests/libvgpu/test_booleans_c.py), and the components that read CUDA_DISABLE_CONTROL."""

from __future__ import annotations

import pytest

from hami import annotations as A
from hami.booleans import bool_or_default, parse_bool
from hami.cluster import ClusterState
from hami.errors import InvalidRequest
from hami.vendors.nvidia import control_disabled
from tests.bool_table import ROWS
from tests.builders import cards, ctr, node, pod


def test_table_has_every_reading():
    readings = {r for _, r in ROWS}
    assert readings == {"true", "false", "invalid"}
    assert len(ROWS) >= 40


@pytest.mark.parametrize(("value", "reading"), ROWS, ids=[repr(v) for v, _ in ROWS])
def test_parse_bool_matches_table(value, reading):
    if reading == "invalid":
        with pytest.raises(InvalidRequest) as exc:
            parse_bool(value, field="CUDA_DISABLE_CONTROL")
        assert "CUDA_DISABLE_CONTROL" in str(exc.value) and "valid:" in str(exc.value)
    else:
        assert parse_bool(value, field="X") is (reading == "true")


@pytest.mark.parametrize(("value", "reading"), ROWS, ids=[repr(v) for v, _ in ROWS])
def test_scheduler_and_device_plugin_read_disable_control_by_table(value, reading):
    """The extender's fit and the device plugin's Allocate both call control_disabled: an invalid
    value keeps control on (False), as libvgpu does."""
    ctr = {"name": "c", "env": [{"name": "CUDA_DISABLE_CONTROL", "value": value}]}
    assert control_disabled(ctr) is (reading == "true")


def test_bool_or_default():
    assert bool_or_default(None, field="X", default=True) is True
    assert bool_or_default("maybe", field="X", default=False) is False
    assert bool_or_default("on", field="X", default=False) is True
    assert bool_or_default("", field="X", default=True) is False


def test_non_string_is_invalid():
    with pytest.raises(InvalidRequest, match="F"):
        parse_bool(1, field="F")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("value", "cores"),
    [("yes", "100"), ("On", "100"), ("t", "100"), ("no", "0"), ("maybe", "0"), (" true", "0")],
    ids=repr,
)
def test_the_scheduler_gives_a_whole_card_exactly_when_libvgpu_would_not_enforce(value, cores):
    # A container libvgpu leaves unlimited must not share a card: the extender's filter reads the
    # value by the same table (100 = the card's cores reserved whole, 0 = shared).
    cs = ClusterState()
    assert cs.upsert_node(node("n", cards("n", 1))) is None
    c = ctr("a", gpu=1, mem=4096) | {"env": [{"name": "CUDA_DISABLE_CONTROL", "value": value}]}
    out = cs.filter(pod(c), ["n"])
    assert out.annotations[A.NVIDIA_ALLOCATED] == f"GPU-n-0,NVIDIA,4096,{cores}:;"
