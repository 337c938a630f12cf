"""Wire formats take ASCII digits only.

Python's ``\\d`` and ``str.isdigit()`` also take other scripts' digits ("١" ARABIC-INDIC ONE, "５"
FULLWIDTH FIVE) and ``isdigit()`` even superscripts ("²", which ``int()`` then refuses with a
ValueError). libvgpu (C ``atoi``/``strtoul``), Go's ``strconv`` and Kubernetes' quantity grammar read
ASCII only, so every parser of such a format must refuse the others with its own clear error.
"""

from __future__ import annotations

import pytest

from device_plugin import vgpu_config as vc
from device_plugin.backends.nvidia import xid_policy
from hami.configparse import coerce
from hami.errors import ConfigError, InvalidRequest
from hami.quantity import parse_quantity
from hami.reasons import parse_reason_text
from hami.settings import duration
from hami.vendors.nvidia import NvidiaVendor
from tests.builders import ctr

NON_ASCII = ["١", "５", "²"]


@pytest.mark.parametrize("digit", NON_ASCII)
def test_vgpu_config_header_takes_ascii_digits_only(digit):
    body = "CUDA_DEVICE_MEMORY_LIMIT=1000m\nCUDA_DEVICE_MEMORY_SHARED_CACHE=/usr/local/vgpu/a.cache\n"
    assert vc.parse("vgpu-config 1\n" + body)["CUDA_DEVICE_MEMORY_LIMIT"] == "1000m"
    with pytest.raises(vc.ConfigFileError, match="line 1: expected"):
        vc.parse(f"vgpu-config {digit}\n" + body)


def test_vgpu_config_limit_names_take_ascii_indexes_only():
    assert vc.is_config_name("CUDA_DEVICE_MEMORY_LIMIT_1")
    assert not vc.is_config_name("CUDA_DEVICE_MEMORY_LIMIT_١")


@pytest.mark.parametrize("digit", NON_ASCII)
def test_quantity_takes_ascii_digits_only(digit):
    assert parse_quantity("5Gi", resource="nvidia.com/gpumem")[0] == 5 * 2**30
    with pytest.raises(InvalidRequest, match="nvidia.com/gpumem"):
        parse_quantity(f"{digit}Gi", resource="nvidia.com/gpumem")


@pytest.mark.parametrize("digit", NON_ASCII)
def test_duration_takes_ascii_digits_only(digit):
    assert duration("5s") == 5.0
    with pytest.raises(InvalidRequest):
        duration(f"{digit}s")


def test_reason_text_takes_ascii_counts_only():
    assert parse_reason_text("1/2 CardInsufficientMemory") is not None
    assert parse_reason_text("١/٢ CardInsufficientMemory") is None


@pytest.mark.parametrize("digit", NON_ASCII)
def test_xid_lists_take_ascii_numbers_only(digit):
    assert 48 in xid_policy({"DP_DISABLE_HEALTHCHECKS": "48"})[1]
    with pytest.raises(ConfigError, match="DP_DISABLE_HEALTHCHECKS: .* is not an XID number"):
        xid_policy({"DP_DISABLE_HEALTHCHECKS": f"4{digit}"})


@pytest.mark.parametrize("digit", NON_ASCII)
def test_config_integers_take_ascii_digits_only(digit):
    assert coerce("nvidia", "libCudaLogLevel", "-3", int) == -3
    with pytest.raises(ConfigError, match="nvidia.libCudaLogLevel: .* must be an integer"):
        coerce("nvidia", "libCudaLogLevel", digit, int)


@pytest.mark.parametrize("digit", NON_ASCII)
def test_task_priority_takes_ascii_digits_only(digit):
    with pytest.raises(InvalidRequest, match=r"nvidia.com/priority\]: .* must be an integer"):
        NvidiaVendor().mutate_container(ctr(mem=1000, **{"nvidia.com/priority": digit}), pod={"spec": {}})
