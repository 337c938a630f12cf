"""Stream-ordered pools are charged as the driver holds their memory: a pool keeps freed
memory (charged) until a synchronisation releases what is above its release threshold, or
cuMemPoolTrimTo trims it; reuse within what the pool holds needs no new charge
(docs/libvgpu.md §4, libvgpu/src/pools.c).
"""

from __future__ import annotations

import pytest

from .conftest import CUDA_ERROR_OUT_OF_MEMORY, CUDA_SUCCESS, MIB

LIMIT = {"CUDA_DEVICE_MEMORY_LIMIT": "64m", "FAKE_GPU_MIB": "1024"}


def meminfo(free_mib: int) -> list[str]:
    return ["meminfo", "0", str(free_mib * MIB), str(64 * MIB)]


@pytest.mark.parametrize("sync", ["sync", "streamsync"])
def test_freed_memory_stays_charged_until_a_synchronisation(cli, sync):
    r = cli.run(
        "init", "async", "40m", "free", "0", "meminfo", "alloc", "30m", sync, "alloc", "30m", env=LIMIT
    )
    assert r.op(3) == meminfo(24)  # the default pool still holds the 40 MiB
    assert r.codes("alloc") == [CUDA_ERROR_OUT_OF_MEMORY, CUDA_SUCCESS]


def test_reuse_within_the_pool_needs_no_new_charge(cli):
    r = cli.run(
        "init", "async", "40m", "free", "0", "alloc", "24m", "async", "40m", "async", "1",
        "calls", "cuMemAllocAsync", env=LIMIT,
    )  # fmt: skip
    assert r.codes("alloc") == [CUDA_SUCCESS]
    assert r.codes("async") == [CUDA_SUCCESS, CUDA_SUCCESS, CUDA_ERROR_OUT_OF_MEMORY]
    assert r.op(6) == ["calls", "0", "2"]  # the refused one never reached the driver


def test_release_threshold_keeps_memory_across_synchronisations(cli):
    r = cli.run(
        "init", "threshold", "-1", "16m", "async", "40m", "free", "0", "sync", "meminfo",
        "async", "10m", "free", "1", "sync", "meminfo", env=LIMIT,
    )  # fmt: skip
    assert r.codes("threshold") == [CUDA_SUCCESS]
    assert r.op(5) == meminfo(48)  # 40 held, 16 kept after the sync
    assert r.op(9) == meminfo(48)  # 10 reused from what is kept


def test_trim_releases_down_to_the_requested_size_not_below_live(cli):
    r = cli.run(
        "init", "threshold", "-1", "1g", "async", "20m", "async", "20m", "free", "0", "sync", "meminfo",
        "trim", "-1", "30m", "meminfo", "trim", "-1", "0", "meminfo", env=LIMIT,
    )  # fmt: skip
    assert r.op(6) == meminfo(24)  # threshold 1 GiB: nothing released at the sync
    assert r.codes("trim") == [CUDA_SUCCESS, CUDA_SUCCESS]
    assert r.op(8) == meminfo(34)
    assert r.op(10) == meminfo(44)  # the live 20 MiB stay charged


def test_explicit_pools_are_modelled_apart(cli):
    r = cli.run(
        "init", "poolcreate", "poolalloc", "0", "30m", "free", "1", "async", "30m", "meminfo",
        "trim", "0", "0", "meminfo", "poolalloc", "0", "40m", env=LIMIT,
    )  # fmt: skip
    assert r.op(5) == meminfo(4)  # 30 held by the created pool + 30 live in the default pool
    assert r.op(7) == meminfo(34)
    assert r.codes("poolalloc") == [CUDA_SUCCESS, CUDA_ERROR_OUT_OF_MEMORY]


def test_current_pool_set_by_the_program_is_followed(cli):
    r = cli.run(
        "init", "poolcreate", "setpool", "0", "async", "30m", "free", "1", "trim", "0", "0", "meminfo",
        env=LIMIT,
    )  # fmt: skip
    assert r.op(6) == meminfo(64)  # trimming the created pool released what cuMemAllocAsync took


def test_destroyed_pool_gives_back_what_it_held(cli):
    r = cli.run(
        "init", "poolcreate", "threshold", "0", "1g", "setpool", "0", "async", "30m", "free", "1",
        "meminfo", "free", "0", "meminfo", env=LIMIT,
    )  # fmt: skip
    assert r.codes("free") == [CUDA_SUCCESS, CUDA_SUCCESS]
    assert r.op(6) == meminfo(34)  # held by the pool (threshold 1 GiB)
    assert r.op(8) == meminfo(64)


GRAPH = {**LIMIT, "FAKE_GRAPH_MIB": "24"}


@pytest.mark.parametrize("op", ["graphlaunch", "graphupload"])
def test_graph_memory_is_charged_until_trimmed(cli, op):
    r = cli.run(
        "init", op, "meminfo", "alloc", "41m", "graphlaunch", "graphtrim", "meminfo", "alloc", "41m", env=GRAPH
    )  # fmt: skip
    assert r.codes(op)[0] == CUDA_SUCCESS
    assert r.op(2) == meminfo(40)  # the graph pool's 24 MiB
    assert r.codes("alloc") == [CUDA_ERROR_OUT_OF_MEMORY, CUDA_SUCCESS]
    assert r.codes("graphtrim") == [CUDA_SUCCESS]
    assert r.op(6) == meminfo(64)


def test_graph_memory_over_the_limit_is_charged_and_blocks_allocations(cli):
    r = cli.run("init", "alloc", "50m", "graphlaunch", "meminfo", "alloc", "1", env=GRAPH)
    assert r.codes("graphlaunch") == [CUDA_SUCCESS]  # the memory exists already: no refusal
    assert r.op(3) == meminfo(0)
    assert r.codes("alloc") == [CUDA_SUCCESS, CUDA_ERROR_OUT_OF_MEMORY]
