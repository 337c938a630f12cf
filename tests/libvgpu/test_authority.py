"""The device plugin's read-only config file is the authority, not the tenant's environment.

Where the file exists, a tenant process cannot switch enforcement off (CUDA_DISABLE_CONTROL), get a
second budget in a region of its own (CUDA_DEVICE_MEMORY_SHARED_CACHE), raise the container's limit
for its siblings by starting first with a larger CUDA_DEVICE_MEMORY_LIMIT*, declare itself high
priority (CUDA_TASK_PRIORITY), lift its compute limit (GPU_CORE_UTILIZATION_POLICY), nor point
libvgpu at a file of its own by preloading a copy of the library beside it. The environment may
only lower its own memory limit. Where no file exists, the environment is read as HAMi-core reads it.
"""

from __future__ import annotations

import shutil

from .conftest import CUDA_ERROR_OUT_OF_MEMORY, CUDA_SUCCESS, MIB
from .region import read_region
from .test_config_file import config
from .test_multiproc import wait_line

GIB = 1 << 30


def test_disable_control_in_the_environment_does_not_lift_the_limit(cli):
    cli.install(cli.tmp / "vgpu", config(cli.cache))
    r = cli.run("init", "alloc", "65m", "alloc", "64m", "alloc", "1", env={"CUDA_DISABLE_CONTROL": "1"})
    assert r.codes("alloc") == [CUDA_ERROR_OUT_OF_MEMORY, CUDA_SUCCESS, CUDA_ERROR_OUT_OF_MEMORY]
    assert "CUDA_DISABLE_CONTROL='1' in the environment is ignored: the config file" in r.stderr


def test_the_files_switch_turns_enforcement_off(cli):
    cli.install(cli.tmp / "vgpu", config(cli.cache, extra="CUDA_DISABLE_CONTROL=true\n"))
    r = cli.run("init", "alloc", "100m", "meminfo", env={"CUDA_DISABLE_CONTROL": "0", "FAKE_GPU_MIB": "1024"})
    assert r.codes("alloc") == [CUDA_SUCCESS]
    assert r.op(2)[3] == str(1024 * MIB)  # the card as it is


def test_a_broken_file_keeps_enforcement_on_whatever_the_environment(cli):
    cli.install(cli.tmp / "vgpu", "vgpu-config 1\nCUDA_TASK_PRIORITY=1\n")  # no limit: malformed
    r = cli.run("init", "alloc", "1", env={"CUDA_DISABLE_CONTROL": "1", "CUDA_DEVICE_MEMORY_LIMIT": "1g"})
    assert r.codes("alloc") == [CUDA_ERROR_OUT_OF_MEMORY]


def test_an_own_region_path_does_not_get_a_second_budget(cli):
    cli.install(cli.tmp / "vgpu", config(cli.cache))
    sibling = cli.popen("init", "alloc", "40m", "hold", env={"CUDA_DEVICE_MEMORY_LIMIT_0": "64m"})
    fresh = cli.tmp / "fresh.cache"
    try:
        wait_line(sibling, "hold")
        r = cli.run("init", "alloc", "30m", "alloc", "24m", "alloc", "1",
                    env={"CUDA_DEVICE_MEMORY_SHARED_CACHE": str(fresh)})  # fmt: skip
    finally:
        sibling.kill()
        sibling.wait()
    assert r.codes("alloc") == [CUDA_ERROR_OUT_OF_MEMORY, CUDA_SUCCESS, CUDA_ERROR_OUT_OF_MEMORY]
    assert not fresh.exists()


def test_a_larger_limit_of_the_first_process_is_not_the_containers(cli):
    cli.install(cli.tmp / "vgpu", config(cli.cache))
    big = {"CUDA_DEVICE_MEMORY_LIMIT_0": "1g", "CUDA_DEVICE_MEMORY_LIMIT": "1g", "FAKE_GPU_MIB": "2048"}
    r = cli.run("init", "meminfo", "alloc", "65m", "alloc", "64m", env=big)
    assert r.op(1) == ["meminfo", "0", str(64 * MIB), str(64 * MIB)]
    assert r.codes("alloc") == [CUDA_ERROR_OUT_OF_MEMORY, CUDA_SUCCESS]
    assert read_region(cli.cache).devices[0].limit_bytes == 64 * MIB  # what every sibling gets
    assert "may only lower it" in r.stderr
    sibling = cli.run_clean("init", "meminfo", "alloc", "65m", extra={"FAKE_GPU_MIB": "2048"})
    assert sibling.op(1) == ["meminfo", "0", str(64 * MIB), str(64 * MIB)]
    assert sibling.codes("alloc") == [CUDA_ERROR_OUT_OF_MEMORY]


def test_a_lower_limit_in_the_environment_holds_that_process_only(cli):
    cli.install(cli.tmp / "vgpu", config(cli.cache))
    low = cli.popen("init", "meminfo", "alloc", "33m", "alloc", "32m", "hold",
                    env={"CUDA_DEVICE_MEMORY_LIMIT": "32m"})  # fmt: skip
    try:
        lines = [wait_line(low, want).split() for want in ("init", "meminfo", "alloc", "alloc", "hold")]
        assert read_region(cli.cache).devices[0].limit_bytes == 64 * MIB
        sibling = cli.run_clean("init", "meminfo", "alloc", "32m", "alloc", "1")
    finally:
        low.kill()
        low.communicate()
    assert lines[1] == ["meminfo", "0", str(32 * MIB), str(32 * MIB)]
    assert [int(f[1]) for f in lines if f[0] == "alloc"] == [CUDA_ERROR_OUT_OF_MEMORY, CUDA_SUCCESS]
    assert sibling.op(1) == ["meminfo", "0", str(32 * MIB), str(64 * MIB)]  # the low one holds 32 MiB
    assert sibling.codes("alloc") == [CUDA_SUCCESS, CUDA_ERROR_OUT_OF_MEMORY]


def test_a_self_declared_priority_is_ignored(cli):
    cli.install(cli.tmp / "vgpu", config(cli.cache))  # CUDA_TASK_PRIORITY=1
    r = cli.run("init", "alloc", "1m", env={"CUDA_TASK_PRIORITY": "0"})
    assert r.codes("alloc") == [CUDA_SUCCESS]
    assert read_region(cli.cache).priority == 1
    assert "CUDA_TASK_PRIORITY='0' in the environment is ignored" in r.stderr


def test_the_files_priority_applies_and_a_file_without_one_means_low(cli):
    cli.install(cli.tmp / "vgpu", config(cli.cache).replace("CUDA_TASK_PRIORITY=1", "CUDA_TASK_PRIORITY=0"))
    assert cli.run_clean("init", "alloc", "1m").codes("alloc") == [CUDA_SUCCESS]
    assert read_region(cli.cache).priority == 0
    cli.cache.unlink()
    cli.install(cli.tmp / "old", config(cli.cache).replace("CUDA_TASK_PRIORITY=1\n", ""))  # an older plugin's
    assert cli.run("init", "alloc", "1m", env={"CUDA_TASK_PRIORITY": "0"}).codes("alloc") == [CUDA_SUCCESS]
    assert read_region(cli.cache).priority == 1


def test_the_compute_limit_cannot_be_switched_off_from_the_environment(cli):
    cli.install(cli.tmp / "vgpu", config(cli.cache, sm="30"))
    r = cli.run("init", "launch", "1",
                env={"GPU_CORE_UTILIZATION_POLICY": "disable", "CUDA_DEVICE_SM_LIMIT": "100", "LIBCUDA_LOG_LEVEL": "3"})  # fmt: skip
    assert r.codes("launch") == [CUDA_SUCCESS]
    assert "compute limiter on" in r.stderr
    assert read_region(cli.cache).devices[0].sm_limit == 30


def test_a_preloaded_copy_beside_a_forged_file_reads_the_plugins_file(cli):
    """The preload list names the plugin's libvgpu.so; the tenant preloads a copy of its own with a
    vgpu.config of 100 GiB beside it. The copy (a test build reading ./ld.so.preload for
    /etc/ld.so.preload) still reads the file beside the plugin's library."""
    lib = cli.build / "preload-test" / "libvgpu.so"
    plugin = cli.tmp / "plugin"
    plugin.mkdir()
    shutil.copy(lib, plugin / "libvgpu.so")
    (plugin / "vgpu.config").write_text(config(cli.cache))
    (cli.tmp / "ld.so.preload").write_text(f"{plugin / 'libvgpu.so'}\n")
    forged = config(cli.tmp / "mine.cache", limit="100g")
    cli.install(cli.tmp / "tenant", forged, lib=lib)  # LD_PRELOAD now names the tenant's copy
    r = cli.run_clean("init", "alloc", "65m", "alloc", "64m", "alloc", "1",
                      extra={"FAKE_GPU_MIB": "4096"}, cwd=cli.tmp)  # fmt: skip
    assert r.codes("alloc") == [CUDA_ERROR_OUT_OF_MEMORY, CUDA_SUCCESS, CUDA_ERROR_OUT_OF_MEMORY]
    assert read_region(cli.cache).devices[0].limit_bytes == 64 * MIB
    assert not (cli.tmp / "mine.cache").exists()


def test_without_a_file_the_environment_rules_as_in_hami_core(cli):
    cli.install(cli.tmp / "vgpu")  # no vgpu.config
    r = cli.run("init", "alloc", "33m", "alloc", "32m", env={"CUDA_DEVICE_MEMORY_LIMIT": "32m", "CUDA_TASK_PRIORITY": "0"})
    assert r.codes("alloc") == [CUDA_ERROR_OUT_OF_MEMORY, CUDA_SUCCESS]
    assert read_region(cli.cache).priority == 0
    off = cli.run("init", "alloc", "100m", env={"CUDA_DEVICE_MEMORY_LIMIT": "32m", "CUDA_DISABLE_CONTROL": "1"})
    assert off.codes("alloc") == [CUDA_SUCCESS]


def test_what_the_device_plugin_renders_holds_against_the_environment(cli):
    from device_plugin import vgpu_config

    envs = {"CUDA_DEVICE_MEMORY_LIMIT_0": "48m", "CUDA_DEVICE_SM_LIMIT": "0",
            "CUDA_DEVICE_MEMORY_SHARED_CACHE": str(cli.cache)}  # fmt: skip
    cli.install(cli.tmp / "vgpu", vgpu_config.render(envs))
    tenant = {"CUDA_DISABLE_CONTROL": "true", "CUDA_TASK_PRIORITY": "0", "CUDA_DEVICE_MEMORY_LIMIT": "1g",
              "CUDA_DEVICE_MEMORY_SHARED_CACHE": str(cli.tmp / "mine.cache")}  # fmt: skip
    r = cli.run("init", "alloc", "49m", "alloc", "48m", env=tenant)
    assert r.codes("alloc") == [CUDA_ERROR_OUT_OF_MEMORY, CUDA_SUCCESS]
    region = read_region(cli.cache)
    assert (region.priority, region.devices[0].limit_bytes) == (1, 48 * MIB)
    assert not (cli.tmp / "mine.cache").exists()
