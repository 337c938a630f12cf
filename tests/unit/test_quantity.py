import pytest

from hami.errors import InvalidRequest
from hami.quantity import parse_quantity, to_count, to_mib, to_percent


@pytest.mark.parametrize(
    ("value", "mib"),
    [("8000", 8000), (8000, 8000), ("16Gi", 16384), ("1Ti", 1048576), ("512Mi", 512), ("1048576Ki", 1024),
     ("0", 0), ("2Gi", 2048), ("20k", 20000), ("24k", 24000), ("1e3", 1000), ("8000000m", 8000)],
)  # fmt: skip
def test_to_mib_converts_units_exactly(value, mib):
    assert to_mib(value, resource="nvidia.com/gpumem") == mib


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ("3000M", "larger than 2147483647 MiB"),
        ("1000001Ki", "976.563 MiB, not a whole number of MiB"),
        ("-1", "negative"),
        ("1.5", "not a whole number of MiB"),
        ("16 Gi", "not a Kubernetes quantity"),
        ("abc", "not a Kubernetes quantity"),
        ("3000000000", "larger than 2147483647 MiB"),
        ("100m", "not a whole number of MiB"),
        (True, "is not a quantity"),
    ],
)
def test_to_mib_rejects_with_resource_name(value, fragment):
    with pytest.raises(InvalidRequest) as e:
        to_mib(value, resource="nvidia.com/gpumem")
    assert str(e.value).startswith("nvidia.com/gpumem: ")
    assert fragment in str(e.value)


def test_canonical_k_suffix_is_mib_and_mega_suffix_is_bytes_only_per_card():
    # The API server writes a bare 20000 as "20k" and a bare 2000000 as "2M" (canonical form).
    assert to_mib("20k", resource="c: nvidia.com/gpumem", per_card=True) == 20000
    assert to_mib("2M", resource="limits.nvidia.com/gpumem") == 2000000
    with pytest.raises(InvalidRequest, match=r"^c: nvidia.com/gpumem: '1000M' is 953.674 MiB, not a whole"):
        to_mib("1000M", resource="c: nvidia.com/gpumem", per_card=True)
    with pytest.raises(InvalidRequest, match=r"'16G' is 15258.789 MiB"):
        to_mib("16G", resource="c: nvidia.com/gpumem", per_card=True)
    assert to_mib("16384M", resource="c: nvidia.com/gpumem", per_card=True) == 15625


def test_to_mib_unit_multiplier_for_vendors_counting_in_blocks():
    assert to_mib("4", resource="cambricon.com/mlu.smlu.vmemory", unit_mib=256) == 1024


def test_16gi_is_never_zero_or_wrapped():
    # HAMi: AsInt64 gives 17179869184 "MiB", int32 overflow, request silently dropped.
    assert to_mib("16Gi", resource="nvidia.com/gpumem") == 16384


@pytest.mark.parametrize(("value", "n"), [("2", 2), (3, 3), ("0", 0), ("1e1", 10), ("2k", 2000)])
def test_to_count(value, n):
    assert to_count(value, resource="nvidia.com/gpu") == n


@pytest.mark.parametrize("value", ["-1", "1.5", "500m", "x"])
def test_to_count_rejects(value):
    with pytest.raises(InvalidRequest, match=r"^nvidia.com/gpu: "):
        to_count(value, resource="nvidia.com/gpu")


def test_to_percent_range_and_units():
    assert to_percent("30", resource="nvidia.com/gpucores") == 30
    with pytest.raises(InvalidRequest, match=r"outside the valid range 0\.\.100"):
        to_percent("101", resource="nvidia.com/gpucores")
    with pytest.raises(InvalidRequest, match="without a unit"):
        to_percent("30Ki", resource="nvidia.com/gpucores")


def test_parse_quantity_exponent_and_suffixes():
    assert parse_quantity("1.5Gi", resource="r") == (1610612736, True)
    assert parse_quantity("12e-1", resource="r")[0] == pytest.approx(1.2)
    assert parse_quantity(".5", resource="r") == (0.5, False)
