"""CUDA arrays are charged their device footprint: the texel footprint computed from the
descriptor (per channel for the normalized x1/x2/x4 formats), or what the driver's tiling and
page rounding really took when that is more (measured); sparse and deferred-mapping arrays own
no memory and are not charged, while VMM memory mapped into them stays charged until the
array is destroyed.
"""

from __future__ import annotations

from .conftest import CUDA_ERROR_OUT_OF_MEMORY, CUDA_SUCCESS, MIB

GIB = 1024 * MIB
LIMIT = {"CUDA_DEVICE_MEMORY_LIMIT": "64m", "FAKE_GPU_MIB": "4096"}


def free_bytes(line: list[str]) -> int:
    assert line[0] == "meminfo" and line[1] == "0", line
    return int(line[2])


def test_page_rounded_arrays_are_charged_what_the_card_gave_them(cli):
    # 40 one-texel arrays, each rounded up to a 2 MiB page by the (fake) driver: 32 fit in 64 MiB
    r = cli.run("init", *["array", "1", "1"] * 40, "meminfo", env={**LIMIT, "FAKE_ARRAY_PAD": str(2 * MIB)})
    assert r.codes("array") == [CUDA_SUCCESS] * 32 + [CUDA_ERROR_OUT_OF_MEMORY] * 8
    assert free_bytes(r.lines[-1]) == 0


def test_normalized_vector_formats_are_charged_per_channel(cli):
    # CU_AD_FORMAT_UNORM_INT8X4 with 4 channels: 4 bytes a texel, 2048 x 2048 = 16 MiB
    r = cli.run("init", *["arrayfmt", "0xc2", "4", "2048", "2048"] * 5, "meminfo", env=LIMIT)
    assert r.codes("arrayfmt") == [CUDA_SUCCESS] * 4 + [CUDA_ERROR_OUT_OF_MEMORY]
    assert free_bytes(r.lines[-1]) == 0


def test_sparse_array_owns_no_memory(cli):
    r = cli.run("init", "sparse", "16384", "16384", "1", "meminfo", env=LIMIT)  # 1 GiB of float texels
    assert r.codes("sparse") == [CUDA_SUCCESS]
    assert free_bytes(r.op(2)) == 64 * MIB


def test_vmm_memory_mapped_into_a_sparse_array_stays_charged_until_the_array_goes(cli):
    env = {"CUDA_DEVICE_MEMORY_LIMIT": "2g", "FAKE_GPU_MIB": "16384"}
    r = cli.run("init", "vmm", "0", "1g", "sparse", "1024", "1024", "1", "arraymap", "1", "0", "free", "0",
                "meminfo", "vmm", "0", "1g", "vmm", "0", "1g", "free", "1", "meminfo", env=env)  # fmt: skip
    assert r.codes("arraymap") == [CUDA_SUCCESS]
    assert free_bytes(r.op(5)) == 1 * GIB  # the handle is released; the array still maps its memory
    assert r.codes("vmm") == [CUDA_SUCCESS, CUDA_SUCCESS, CUDA_ERROR_OUT_OF_MEMORY]
    assert r.codes("free") == [CUDA_SUCCESS, CUDA_SUCCESS]
    assert free_bytes(r.op(9)) == 1 * GIB  # array destroyed: its mapping's memory freed


def test_cumemmaparrayasync_is_reached_through_each_door(cli):
    r = cli.run("dlsym", "cuMemMapArrayAsync", "procaddr", "cuMemMapArrayAsync", "12000", "0")
    assert r.op(0) == ["dlsym", "libvgpu.so:cuMemMapArrayAsync"]
    assert r.op(1) == ["procaddr", "0", "0", "libvgpu.so:cuMemMapArrayAsync"]
