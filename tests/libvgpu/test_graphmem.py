"""Graph memory (memory-allocation nodes, cudaMallocAsync captured into a graph) is checked
before the driver allocates it: an instantiation whose nodes cannot fit is refused with
CUDA_ERROR_OUT_OF_MEMORY, and an upload or launch that would grow the graph pool past the limit
is refused before the driver is called. Before, a 6 GiB node was charged only after the launch
had taken the memory, and held under a 2 GiB limit.
"""

from __future__ import annotations

import pytest

from .conftest import CUDA_ERROR_OUT_OF_MEMORY, CUDA_SUCCESS, MIB

GIB = 1024 * MIB
LIMIT = {"CUDA_DEVICE_MEMORY_LIMIT": "2g", "FAKE_GPU_MIB": "16384"}
PTDS = "2"


def free_bytes(line: list[str]) -> int:
    assert line[0] == "meminfo" and line[1] == "0", line
    return int(line[2])


@pytest.mark.parametrize("how", ["flags", "params", "params_ptsz", "v2", "v1"])
def test_six_gib_node_under_two_gib_is_refused_at_instantiation(cli, how):
    fn = {"flags": "cuGraphInstantiateWithFlags", "params": "cuGraphInstantiateWithParams",
          "params_ptsz": "cuGraphInstantiateWithParams_ptsz", "v2": "cuGraphInstantiate_v2",
          "v1": "cuGraphInstantiate"}[how]  # fmt: skip
    r = cli.run("init", "graphcreate", "graphalloc", "0", "6g", "instantiate", "0", how, "calls", fn, "meminfo",
                env=LIMIT)  # fmt: skip
    assert r.codes("graphalloc") == [CUDA_SUCCESS]
    assert r.codes("instantiate") == [CUDA_ERROR_OUT_OF_MEMORY]
    assert r.op(4) == ["calls", "0", "0"]  # the driver never instantiated it
    assert free_bytes(r.op(5)) == 2 * GIB


def test_node_that_fits_is_charged_once_launched(cli):
    r = cli.run("init", "graphcreate", "graphalloc", "0", "1g", "instantiate", "0", "flags", "meminfo",
                "execlaunch", "1", "meminfo", "alloc", "1g", "alloc", "1", env=LIMIT)  # fmt: skip
    assert r.codes("instantiate") == [CUDA_SUCCESS]
    assert free_bytes(r.op(4)) == 2 * GIB  # nothing allocated yet
    assert r.codes("execlaunch") == [CUDA_SUCCESS]
    assert free_bytes(r.op(6)) == 1 * GIB  # the graph pool's reservation
    assert r.codes("alloc") == [CUDA_SUCCESS, CUDA_ERROR_OUT_OF_MEMORY]


@pytest.mark.parametrize(("op", "fn"), [("execlaunch", "cuGraphLaunch"), ("execupload", "cuGraphUpload")])
def test_launch_that_no_longer_fits_is_refused_before_the_driver(cli, op, fn):
    # instantiated while it fitted; the container then took the room: the first launch (or
    # upload), which would make the driver reserve the node's memory, is refused
    r = cli.run("init", "graphcreate", "graphalloc", "0", "1g", "instantiate", "0", "flags", "alloc", "1536m",
                op, "1", "calls", fn, "meminfo", env=LIMIT)  # fmt: skip
    assert r.codes("instantiate") == [CUDA_SUCCESS]
    assert r.codes(op) == [CUDA_ERROR_OUT_OF_MEMORY]
    assert r.op(6) == ["calls", "0", "0"]
    assert free_bytes(r.op(7)) == 512 * MIB


def test_relaunch_reuses_the_pool_and_needs_no_new_room(cli):
    r = cli.run("init", "graphcreate", "graphalloc", "0", "1g", "instantiate", "0", "flags",
                "execlaunch", "1", "alloc", "1g", "execlaunch", "1", "meminfo", env=LIMIT)  # fmt: skip
    assert r.codes("execlaunch") == [CUDA_SUCCESS, CUDA_SUCCESS]  # the pool's spare 1 GiB is reused
    assert free_bytes(r.op(7)) == 0


def test_child_graph_memory_nodes_count(cli):
    r = cli.run("init", "graphcreate", "graphalloc", "0", "6g", "graphcreate", "graphchild", "1", "0",
                "instantiate", "1", "flags", env=LIMIT)  # fmt: skip
    assert r.codes("graphchild") == [CUDA_SUCCESS]
    assert r.codes("instantiate") == [CUDA_ERROR_OUT_OF_MEMORY]


def test_malloc_async_captured_into_a_graph_is_checked_at_instantiation(cli):
    # cudaMallocAsync during stream capture adds an allocation node; 6 GiB under 2 GiB is refused
    r = cli.run("init", "streamcreate", "capture", "0", "capalloc", "0", "6g", "meminfo", "capfree", "0", "1",
                "capend", "0", "instantiate", "2", "flags", env=LIMIT)  # fmt: skip
    assert r.codes("capalloc") == [CUDA_SUCCESS]
    assert free_bytes(r.op(4)) == 2 * GIB  # the captured call allocated nothing: not charged
    assert r.codes("capend") == [CUDA_SUCCESS]
    assert r.codes("instantiate") == [CUDA_ERROR_OUT_OF_MEMORY]


def test_captured_malloc_async_that_fits_is_charged_once_at_launch(cli):
    r = cli.run("init", "streamcreate", "capture", "0", "capalloc", "0", "1g", "capfree", "0", "1", "capend", "0",
                "sync", "meminfo", "instantiate", "2", "flags", "execlaunch", "3", "meminfo", env=LIMIT)  # fmt: skip
    assert free_bytes(r.op(7)) == 2 * GIB
    assert r.codes("execlaunch") == [CUDA_SUCCESS]
    assert free_bytes(r.op(10)) == 1 * GIB


def test_destroyed_instantiation_is_forgotten(cli):
    r = cli.run("init", "graphcreate", "graphalloc", "0", "1g", "instantiate", "0", "flags", "execdestroy", "1",
                "alloc", "2g", env=LIMIT)  # fmt: skip
    assert r.codes("execdestroy") == [CUDA_SUCCESS]
    assert r.codes("alloc") == [CUDA_SUCCESS]


HOOKS = ["cuGraphInstantiate", "cuGraphInstantiate_v2", "cuGraphInstantiateWithFlags",
         "cuGraphInstantiateWithParams", "cuGraphInstantiateWithParams_ptsz", "cuGraphExecDestroy"]  # fmt: skip


@pytest.mark.parametrize("name", HOOKS)
def test_every_graph_hook_is_reached_through_dlsym(cli, name):
    assert cli.run("dlsym", name).op(0) == ["dlsym", f"libvgpu.so:{name}"]


@pytest.mark.parametrize(
    ("sym", "ver", "flags", "want"),
    [
        ("cuGraphInstantiateWithFlags", "12000", "0", "cuGraphInstantiateWithFlags"),
        ("cuGraphInstantiateWithParams", "12000", "0", "cuGraphInstantiateWithParams"),
        ("cuGraphInstantiateWithParams", "12000", PTDS, "cuGraphInstantiateWithParams_ptsz"),
        ("cuGraphInstantiate", "11000", "0", "cuGraphInstantiate_v2"),
        ("cuGraphExecDestroy", "12000", "0", "cuGraphExecDestroy"),
    ],
)
def test_every_graph_hook_is_reached_through_cugetprocaddress(cli, sym, ver, flags, want):
    r = cli.run("procaddr", sym, ver, flags, "procaddr1", sym, ver, flags)
    assert r.op(0) == ["procaddr", "0", "0", f"libvgpu.so:{want}"]
    assert r.op(1) == ["procaddr1", "0", "-1", f"libvgpu.so:{want}"]
