"""device_plugin.vgpu_config: the config file beside libvgpu (render/parse by libvgpu's rules)
and the node-wide per-card region files; libvgpu reading what render writes is tested in
tests/libvgpu/test_config_file.py."""

from __future__ import annotations

import os
import stat

import pytest

from device_plugin import vgpu_config as vc

ENVS = {
    "NVIDIA_VISIBLE_DEVICES": "GPU-a,GPU-b",
    "CUDA_DEVICE_MEMORY_LIMIT_0": "3000m",
    "CUDA_DEVICE_MEMORY_LIMIT_1": "2000m",
    "CUDA_DEVICE_SM_LIMIT": "30",
    "CUDA_DEVICE_MEMORY_SHARED_CACHE": "/usr/local/vgpu/5d3c.cache",
    "LIBCUDA_LOG_LEVEL": "1",
    "LIBVGPU_CARD_DIR": "/usr/local/vgpu/cards",
}


def test_render_writes_the_libvgpu_facts_only_under_a_versioned_header():
    text = vc.render(ENVS, priority="0")
    lines = [ln for ln in text.splitlines() if not ln.startswith("#")]
    assert lines == [
        "vgpu-config 1",
        "CUDA_DEVICE_MEMORY_LIMIT_0=3000m",
        "CUDA_DEVICE_MEMORY_LIMIT_1=2000m",
        "CUDA_DEVICE_MEMORY_SHARED_CACHE=/usr/local/vgpu/5d3c.cache",
        "CUDA_DEVICE_SM_LIMIT=30",
        "CUDA_DISABLE_CONTROL=false",
        "CUDA_TASK_PRIORITY=0",
        "LIBVGPU_CARD_DIR=/usr/local/vgpu/cards",
    ]
    assert vc.parse(text) == {k: v for k, v in ENVS.items() if vc.is_config_name(k)} | {
        "CUDA_TASK_PRIORITY": "0", "CUDA_DISABLE_CONTROL": "false"
    }


def test_render_states_the_switch_and_the_priority_libvgpu_takes_from_the_file_alone():
    """Where the file exists libvgpu ignores the environment for these: the file says them."""
    facts = vc.parse(vc.render(ENVS))
    assert (facts["CUDA_DISABLE_CONTROL"], facts["CUDA_TASK_PRIORITY"]) == ("false", "1")
    facts = vc.parse(vc.render({**ENVS, "CUDA_DISABLE_CONTROL": "true"}, priority="0"))
    assert (facts["CUDA_DISABLE_CONTROL"], facts["CUDA_TASK_PRIORITY"]) == ("true", "0")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "no 'vgpu-config 1' header"),
        ("CUDA_DEVICE_MEMORY_LIMIT_0=64m\n", "line 1: expected 'vgpu-config 1'"),
        ("vgpu-config 2\n", "format version 2, libvgpu reads 1"),
        ("vgpu-config 1\nCUDA_DEVICE_MEMORY_LIMIT_0 64m\n", "line 2: expected NAME=VALUE"),
        ("vgpu-config 1\nCUDA_DEVICE_MEMORY_LIMIT_0=64m\0\n", "line 2 holds a NUL byte"),
        ("vgpu-config 1\ncuda_device_memory_limit_0=64m\n", "line 2: bad name"),
        ("vgpu-config 1\nCUDA_DEVICE_MEMORY_LIMIT_0=" + "9" * 600 + "\n", "value too long"),
        ("vgpu-config 1\n" + "# padding\n" * 7000, "larger than 65536 bytes"),
        ("vgpu-config 1\nCUDA_DEVICE_MEMORY_SHARED_CACHE=/x\n", "no CUDA_DEVICE_MEMORY_LIMIT"),
        (
            "vgpu-config 1\nCUDA_DEVICE_MEMORY_LIMIT=1g\nCUDA_DEVICE_MEMORY_SHARED_CACHE=x\n",
            "not an absolute path",
        ),
    ],
    ids=[
        "empty",
        "no-header",
        "future",
        "no-equals",
        "nul",
        "lower-case",
        "long",
        "huge",
        "no-limit",
        "relative",
    ],
)
def test_parse_refuses_what_libvgpu_refuses(text, message):
    with pytest.raises(vc.ConfigFileError, match=message):
        vc.parse(text)


def test_parse_skips_unknown_names_of_a_newer_plugin():
    facts = vc.parse(
        "vgpu-config 1\nCUDA_DEVICE_MEMORY_LIMIT=1g\nCUDA_DEVICE_MEMORY_SHARED_CACHE=/c\nNEW_FACT=1\n"
    )
    assert facts == {"CUDA_DEVICE_MEMORY_LIMIT": "1g", "CUDA_DEVICE_MEMORY_SHARED_CACHE": "/c"}


def test_render_refuses_a_value_that_is_not_one_line():
    with pytest.raises(vc.ConfigFileError, match="CUDA_DEVICE_SM_LIMIT: value '3\\\\n0' is not one line"):
        vc.render({**ENVS, "CUDA_DEVICE_SM_LIMIT": "3\n0"})


def test_container_priority_by_value_last_wins():
    ctr = {"env": [{"name": "CUDA_TASK_PRIORITY", "value": "1"}, {"name": "CUDA_TASK_PRIORITY", "value": "0"},
                   {"name": "X", "value": "2"}]}  # fmt: skip
    assert vc.container_priority(ctr) == "0"
    assert vc.container_priority({"env": [{"name": "CUDA_TASK_PRIORITY", "valueFrom": {}}]}) is None
    assert vc.container_priority({}) is None


def test_prepare_writes_a_read_only_file_and_keeps_existing_card_regions(tmp_path):
    vgpu = tmp_path / "vgpu"
    cache_dir = vgpu / "containers" / "uid_main"
    cache_dir.mkdir(parents=True)
    (vgpu / "cards").mkdir()
    existing = vgpu / "cards" / "GPU-a.card"
    existing.write_bytes(b"VCRD state of the other tenants")
    mounts = vc.prepare(vgpu, cache_dir, ENVS, ["GPU-a", "GPU-b", "GPU-a"], {"env": []})
    assert mounts == [
        vc.MountSpec(f"{vgpu}/vgpu.config", str(cache_dir / "vgpu.config"), True),
        vc.MountSpec(f"{vgpu}/cards/GPU-a.card", f"{vgpu}/cards/GPU-a.card", False),
        vc.MountSpec(f"{vgpu}/cards/GPU-b.card", f"{vgpu}/cards/GPU-b.card", False),
    ]
    cfg = cache_dir / "vgpu.config"
    assert stat.S_IMODE(cfg.stat().st_mode) == 0o444
    assert vc.parse(cfg.read_text())["CUDA_DEVICE_MEMORY_LIMIT_1"] == "2000m"
    assert existing.read_bytes() == b"VCRD state of the other tenants"  # never truncated
    new = vgpu / "cards" / "GPU-b.card"
    assert new.stat().st_size == 0 and stat.S_IMODE(new.stat().st_mode) == 0o666
    # a second Allocate for the same container replaces the file atomically
    vc.prepare(vgpu, cache_dir, {**ENVS, "CUDA_DEVICE_SM_LIMIT": "50"}, ["GPU-a"], {"env": []})
    assert vc.parse(cfg.read_text())["CUDA_DEVICE_SM_LIMIT"] == "50"
    assert not [p for p in os.listdir(cache_dir) if p.endswith(".tmp")]


def test_prepare_refuses_a_card_uuid_that_is_not_a_file_name(tmp_path):
    (tmp_path / "c").mkdir()
    with pytest.raises(vc.ConfigFileError, match="card UUID '../x' is not usable as a file name"):
        vc.prepare(tmp_path, tmp_path / "c", ENVS, ["../x"], {})


def test_the_limiters_slice_length_is_the_files_not_the_tenants():
    # libvgpu reads LIBVGPU_SM_SLICE_MS from the file alone (a slice of days never pauses); the
    # plugin's reader knows the name too, so both agree on a file that carries it
    assert vc.is_config_name("LIBVGPU_SM_SLICE_MS")
    text = vc.render({"CUDA_DEVICE_MEMORY_LIMIT_0": "1000m", "CUDA_DEVICE_MEMORY_SHARED_CACHE": "/v/a.cache",
                      "LIBVGPU_SM_SLICE_MS": "100"})  # fmt: skip
    assert "LIBVGPU_SM_SLICE_MS=100" in text.splitlines()


def test_the_cards_are_written_by_uuid_in_index_order():
    # libvgpu finds CUDA_DEVICE_MEMORY_LIMIT_<i> of a card by LIBVGPU_DEVICE_UUID_<i>, not by an ordinal
    # the tenant's CUDA_VISIBLE_DEVICES or the node's PCI order can shift
    facts = vc.parse(vc.render(ENVS, uuids=["GPU-b", "GPU-a"]))
    assert (facts["LIBVGPU_DEVICE_UUID_0"], facts["LIBVGPU_DEVICE_UUID_1"]) == ("GPU-b", "GPU-a")
    assert "LIBVGPU_DEVICE_UUID_0" not in vc.parse(vc.render(ENVS))


def test_prepare_lists_the_containers_cards(tmp_path):
    envs = {"CUDA_DEVICE_MEMORY_LIMIT_0": "1000m", "CUDA_DEVICE_MEMORY_LIMIT_1": "2000m",
            "CUDA_DEVICE_MEMORY_SHARED_CACHE": "/v/a.cache"}  # fmt: skip
    cache = tmp_path / "ctr"
    cache.mkdir()
    vc.prepare(tmp_path, cache, envs, ["GPU-b", "GPU-a"], {})
    facts = vc.parse((cache / "vgpu.config").read_text())
    assert (facts["LIBVGPU_DEVICE_UUID_0"], facts["LIBVGPU_DEVICE_UUID_1"]) == ("GPU-b", "GPU-a")
