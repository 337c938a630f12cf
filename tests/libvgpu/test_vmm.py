"""VMM (cuMemCreate/cuMemMap) memory is charged for as long as the driver keeps it: until every
handle to it is released AND its last mapping is unmapped, so the documented idiom (create, map,
release the handle at once) cannot hold memory past the limit. Imported shareable handles are
charged to the importer at the extent it maps. Every new hook is reached through each door.
"""

from __future__ import annotations

import pytest

from .conftest import CUDA_ERROR_OUT_OF_MEMORY, CUDA_SUCCESS, MIB

GIB = 1024 * MIB
LIMIT = {"CUDA_DEVICE_MEMORY_LIMIT": "2g", "FAKE_GPU_MIB": "16384"}


def free_bytes(line: list[str]) -> int:
    assert line[0] == "meminfo" and line[1] == "0", line
    return int(line[2])


def test_release_after_map_keeps_the_charge_eight_times_one_gib_under_two(cli):
    # NVIDIA's create -> map -> release idiom, 8 x 1 GiB under a 2 GiB limit: the third create is
    # refused (the released handles' memory is still mapped), and no create past it succeeds.
    ops = ["init"]
    for k in range(8):
        ops += [
            "vmm",
            "0",
            "1g",
            "vmmmap",
            str(2 * k) if k < 2 else "0",
            "0",
            "free",
            str(2 * k) if k < 2 else "0",
        ]
    ops += ["meminfo"]
    r = cli.run(*ops, env=LIMIT)
    assert r.codes("vmm") == [CUDA_SUCCESS, CUDA_SUCCESS] + [CUDA_ERROR_OUT_OF_MEMORY] * 6
    assert r.codes("vmmmap")[:2] == [CUDA_SUCCESS, CUDA_SUCCESS]
    assert free_bytes(r.lines[-1]) == 0


def test_unmapping_the_last_mapping_of_a_released_handle_gives_the_charge_back(cli):
    r = cli.run("init", "vmm", "0", "1g", "vmmmap", "0", "0", "free", "0", "meminfo",
                "vmmunmap", "1", "meminfo", "vmm", "0", "2g", env=LIMIT)  # fmt: skip
    assert free_bytes(r.op(4)) == 1 * GIB  # released, still mapped: charged
    assert free_bytes(r.op(6)) == 2 * GIB  # unmapped: the driver freed it
    assert r.codes("vmm") == [CUDA_SUCCESS, CUDA_SUCCESS]


def test_unmapped_handle_is_charged_until_released(cli):
    r = cli.run("init", "vmm", "0", "1g", "vmmmap", "0", "0", "vmmunmap", "1", "meminfo",
                "free", "0", "meminfo", env=LIMIT)  # fmt: skip
    assert free_bytes(r.op(4)) == 1 * GIB
    assert free_bytes(r.op(6)) == 2 * GIB


def test_two_mappings_of_one_handle_charge_once_and_hold_it_until_both_go(cli):
    r = cli.run("init", "vmm", "0", "1g", "vmmmap", "0", "0", "vmmmap", "0", "0", "free", "0", "meminfo",
                "vmmunmap", "1", "meminfo", "vmmunmap", "2", "meminfo", env=LIMIT)  # fmt: skip
    assert [free_bytes(r.op(k)) for k in (5, 7, 9)] == [1 * GIB, 1 * GIB, 2 * GIB]


def test_retained_handle_neither_double_charges_nor_double_frees(cli):
    # cuMemRetainAllocationHandle returns the same handle with one more reference: charged once;
    # the charge lasts until both references are released and the mapping is gone.
    r = cli.run("init", "vmm", "0", "1g", "vmmmap", "0", "0", "vmmretain", "1", "meminfo",
                "free", "0", "free", "2", "meminfo", "vmmunmap", "1", "meminfo", "free", "2", "meminfo",
                env=LIMIT)  # fmt: skip
    assert r.codes("vmmretain") == [CUDA_SUCCESS]
    assert free_bytes(r.op(4)) == 1 * GIB  # one allocation, charged once
    assert r.codes("free") == [CUDA_SUCCESS, CUDA_SUCCESS, 1]  # the third release: the driver refuses
    assert free_bytes(r.op(7)) == 1 * GIB  # both references released, still mapped
    assert free_bytes(r.op(9)) == 2 * GIB
    assert free_bytes(r.op(11)) == 2 * GIB  # the refused release changed nothing


def test_address_free_under_live_mappings_gives_back_only_what_the_card_got_back(cli):
    # cuMemAddressFree of a range still mapped: the fake driver unmaps (memory freed) ...
    ops = ("init", "vmm", "0", "1g", "vmmmap", "0", "0", "free", "0", "vaddrfree", "1", "meminfo")
    r = cli.run(*ops, env=LIMIT)
    assert r.codes("vaddrfree") == [CUDA_SUCCESS]
    assert free_bytes(r.op(5)) == 2 * GIB
    # ... or keeps the memory: then the charge stays, as the memory does
    r = cli.run(*ops, env={**LIMIT, "FAKE_VMM_ADDRFREE_KEEPS": "1"})
    assert free_bytes(r.op(5)) == 1 * GIB


def test_imported_handle_is_charged_at_the_mapped_extent(cli):
    # The exporter releases its handle (charge given back, it holds no mapping) while the import
    # keeps the memory alive: mapping the import charges the importer, so the limit holds.
    env = {**LIMIT, "CUDA_DEVICE_MEMORY_LIMIT": "1536m"}
    r = cli.run("init", "vmm", "0", "1g", "vmmexport", "0", "vmmimport", "1000", "free", "0", "meminfo",
                "vmmmap", "1", "1g", "meminfo", "vmm", "0", "1g", env=env)  # fmt: skip
    assert r.codes("vmmimport") == [CUDA_SUCCESS]
    assert free_bytes(r.op(5)) == 1536 * MIB
    assert r.codes("vmmmap") == [CUDA_SUCCESS]
    assert free_bytes(r.op(7)) == 512 * MIB
    assert r.codes("vmm") == [CUDA_SUCCESS, CUDA_ERROR_OUT_OF_MEMORY]


def test_mapping_an_import_over_the_limit_is_refused_before_the_driver_maps(cli):
    env = {**LIMIT, "CUDA_DEVICE_MEMORY_LIMIT": "1536m"}
    r = cli.run("init", "vmm", "0", "1g", "vmmexport", "0", "vmmimport", "1000", "free", "0",
                "alloc", "1g", "vmmmap", "1", "1g", "calls", "cuMemMap", env=env)  # fmt: skip
    assert r.codes("alloc") == [CUDA_SUCCESS]
    assert r.codes("vmmmap") == [CUDA_ERROR_OUT_OF_MEMORY]
    assert r.op(7) == ["calls", "0", "0"]


def test_memory_bound_to_a_multicast_object_stays_charged_until_unbound(cli):
    # NVLS: a handle bound to a multicast object keeps its memory after cuMemRelease
    r = cli.run("init", "vmm", "0", "1g", "mccreate", "1g", "mcbind", "1", "0", "free", "0", "meminfo",
                "vmm", "0", "1g", "vmm", "0", "1g", "mcunbind", "1", "0", "meminfo", env=LIMIT)  # fmt: skip
    assert r.codes("mcbind") == [CUDA_SUCCESS]
    assert free_bytes(r.op(5)) == 1 * GIB
    assert r.codes("vmm") == [CUDA_SUCCESS, CUDA_SUCCESS, CUDA_ERROR_OUT_OF_MEMORY]
    assert r.codes("mcunbind") == [CUDA_SUCCESS]
    assert free_bytes(r.op(9)) == 1 * GIB  # unbound and released: freed


def test_memory_bound_by_address_stays_charged_after_unmap_and_release(cli):
    r = cli.run("init", "vmm", "0", "1g", "vmmmap", "0", "0", "mccreate", "1g", "mcbindaddr", "2", "1",
                "vmmunmap", "1", "free", "0", "meminfo", "free", "2", "meminfo", env=LIMIT)  # fmt: skip
    assert r.codes("mcbindaddr") == [CUDA_SUCCESS]
    assert free_bytes(r.op(7)) == 1 * GIB  # unmapped and released, still bound
    assert free_bytes(r.op(9)) == 2 * GIB  # the multicast object released: unbound, freed


def test_releasing_the_multicast_object_frees_what_was_bound_to_it(cli):
    r = cli.run("init", "vmm", "0", "1g", "mccreate", "1g", "mcbind", "1", "0", "free", "0", "meminfo",
                "free", "1", "meminfo", env=LIMIT)  # fmt: skip
    assert free_bytes(r.op(5)) == 1 * GIB
    assert free_bytes(r.op(7)) == 2 * GIB


HOOKS = ["cuMemCreate", "cuMemRelease", "cuMemMap", "cuMemUnmap", "cuMemRetainAllocationHandle",
         "cuMemAddressFree", "cuMemImportFromShareableHandle", "cuMulticastCreate", "cuMulticastBindMem",
         "cuMulticastBindAddr", "cuMulticastUnbind"]  # fmt: skip


@pytest.mark.parametrize("name", HOOKS)
def test_every_vmm_hook_is_reached_through_each_door(cli, name):
    # door A is the symbol itself (the tests above call it); door B dlsym on a libcuda handle;
    # door C cuGetProcAddress(_v2), which cudaGetDriverEntryPoint goes through
    r = cli.run("dlsym", name, "procaddr", name, "12080", "0", "procaddr1", name, "12080", "0")
    want = f"libvgpu.so:{name}"
    assert r.op(0) == ["dlsym", want]
    assert r.op(1) == ["procaddr", "0", "0", want]
    assert r.op(2) == ["procaddr1", "0", "-1", want]
