"""The device plugin's MIG parts against the fake NVML (`kubefakes.nvml`): geometry and creation errors,
discovery and registration of MIG cards (dynamic and static), the instance manager (placement,
apply lock, ledger, adoption, reconciliation, foreign instances) and the MPS daemon's supervision."""

from __future__ import annotations

import asyncio
import json
import sys
import textwrap

import pynvml
import pytest

from device_plugin.backends.nvidia import NvidiaBackend
from device_plugin.devices import DeviceState
from device_plugin.mig.controller import active_allocations
from device_plugin.mig.manager import MigError, MigManager
from device_plugin.mig.nvml import MigNvml
from device_plugin.mps.allocate import mps_env
from device_plugin.mps.daemon import MpsDaemon
from hami import annotations as A
from hami.annotations import MigAllocation
from hami.errors import ConfigError
from hami.model import ContainerDevice, MigPlacement
from hami.registration import encode_node_devices_json
from hami.vendors.nvidia_mig import MigProfileAllowlist
from kubefakes.nvml import A100_40GB, H100_80GB, H200_141GB, V100, FakeNvml, gpu

P = MigPlacement
ALLOW = (
    MigProfileAllowlist(("A100-SXM4-40GB",), ("1g.5gb", "2g.10gb", "3g.20gb", "7g.40gb")),
    MigProfileAllowlist(("H100",), ("1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "7g.80gb")),
)


def nvml(*gpus):
    nv = FakeNvml(list(gpus) or [gpu(A100_40GB, 0)])
    nv.nvmlInit()
    return nv


def backend(nv, **kw):
    kw.setdefault("operating_mode", "mig")
    kw.setdefault("mig_allowlist", ALLOW)
    return NvidiaBackend(nvml=nv, env={}, **kw)


def manager(nv, tmp_path, backend_=None):
    b = backend_ or backend(nv)
    cards = b.discover()
    return MigManager(
        b.mig, {c.uuid: (lambda u=c.uuid: b.handle(u)) for c in cards}, b.mig_profiles,
        ledger=tmp_path / "mig" / "instances.json", apply_lock=tmp_path / "lock" / "hami-mig-apply.lock",
    ), cards  # fmt: skip


# -- the fake NVML's geometry -------------------------------------------------------------------


def test_fake_nvml_refuses_what_a_card_refuses():
    nv = nvml()
    m = MigNvml(nv)
    h = nv.nvmlDeviceGetHandleByIndex(0)
    uuid = nv.nvmlDeviceGetUUID(h)
    profiles = {p.name: p for p in m.profiles(h)}
    # the MIG user guide's placements: 3g at 0 and 4, taking 4 memory slices; 7g all 8
    assert profiles["3g.20gb"].placements == (P(0, 4), P(4, 4))
    assert profiles["7g.40gb"].placements == (P(0, 8),)
    assert profiles["1g.10gb"].placements == (P(0, 2), P(2, 2), P(4, 2), P(6, 2))
    m.create(h, uuid, profiles["3g.20gb"], P(4, 4))
    with pytest.raises(pynvml.NVMLError_InsufficientResources):
        m.create(h, uuid, profiles["1g.5gb"], P(5, 1))  # overlaps the 3g
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        m.create(h, uuid, profiles["2g.10gb"], P(1, 2))  # not a 2g placement
    nv.fail_next("nvmlGpuInstanceCreateComputeInstance", pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)
    with pytest.raises(pynvml.NVMLError_InsufficientResources):
        m.create(h, uuid, profiles["2g.10gb"], P(0, 2))
    # the GPU instance made before the compute instance failed was destroyed again
    assert [(i[0], i[1]) for i in nv.instances(0)] == [("3g.20gb", 4)]
    off = nvml(gpu(A100_40GB, 0, mig=False))
    h = off.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        MigNvml(off).create(h, "x", profiles["1g.5gb"], P(6, 1))


# -- discovery and registration ------------------------------------------------------------------


def test_mig_mode_registers_the_allowed_profiles_with_nvmls_geometry():
    nv = nvml(gpu(A100_40GB, 0), gpu(H100_80GB, 1), gpu(A100_40GB, 2, mig=False), gpu(V100, 3))
    cards = backend(nv).discover()
    assert [c.index for c in cards] == [0, 1]  # MIG off, and no MIG at all: skipped, never switched on
    assert nv.mig_mode_changes == 0
    a100 = cards[0]
    assert a100.slots == 7 and a100.memory_mib == 40960
    assert [(p.name, p.memory_mb, p.core, p.slice_count) for p in a100.mig_profiles] == [
        ("1g.5gb", 4864, 15, 1), ("2g.10gb", 9984, 29, 2), ("3g.20gb", 20096, 43, 3), ("7g.40gb", 40192, 100, 7),
    ]  # fmt: skip
    state = DeviceState(cards, split_count=10)
    (dev, _) = state.registration(memory_scaling=1, core_scaling=1, mode="mig")
    encoded = encode_node_devices_json([dev])
    assert encoded.startswith(
        f'[{{"id":"{a100.uuid}","count":7,"devmem":40960,"devcore":100,"type":"NVIDIA A100-SXM4-40GB",'
        '"mode":"mig","migProfiles":[{"name":"1g.5gb","memoryMB":4864,"core":15,"sliceCount":1,'
        '"placements":[{"start":0,"size":1},{"start":1,"size":1},'
    )
    assert encoded.endswith(
        '{"name":"7g.40gb","memoryMB":40192,"core":100,"sliceCount":7,"placements":[{"start":0,"size":8}]}],"health":true}]'
    )
    # profiles are matched by NVML's own name: H100's 1g.20gb is the double-memory 1g, not 1g.10gb
    h100 = {p.name: p for p in cards[1].mig_profiles}
    assert (h100["1g.20gb"].memory_mb, h100["1g.20gb"].placements[1]) == (20096, P(2, 2))
    assert (h100["1g.10gb"].memory_mb, h100["1g.10gb"].core) == (9984, 13)
    assert len(state.virtual_devices()) == 14  # 7 per card


def test_an_h200_registers_with_the_charts_profiles():
    allow = (MigProfileAllowlist(("H200",), ("1g.18gb", "2g.35gb", "3g.71gb", "7g.141gb")),)
    (card,) = backend(nvml(gpu(H200_141GB, 0)), mig_allowlist=allow).discover()
    assert [p.name for p in card.mig_profiles] == ["1g.18gb", "2g.35gb", "3g.71gb", "7g.141gb"]


def test_static_mig_registers_an_administrators_instances_as_cards():
    nv = nvml(gpu(A100_40GB, 0), gpu(V100, 1))
    a = nv.admin_create(0, "3g.20gb", 4)
    b = nv.admin_create(0, "2g.10gb", 0)
    cards = backend(nv, operating_mode="hami-core", mig_strategy="mixed").discover()
    assert [(c.uuid, c.index, c.model, c.memory_mib) for c in cards] == [
        (cards[0].uuid, 0, "NVIDIA-Tesla V100-PCIE-32GB", 32768),
        (b, 1, "NVIDIA A100-SXM4-40GB MIG 2g.10gb", 9984),
        (a, 2, "NVIDIA A100-SXM4-40GB MIG 3g.20gb", 20096),
    ]
    with pytest.raises(ConfigError, match="migstrategy single"):
        backend(nv, operating_mode="hami-core", mig_strategy="single").discover()
    # none (the default): the MIG card is skipped, as before
    assert [c.index for c in backend(nv, operating_mode="hami-core").discover()] == [1]


# -- the instance manager ----------------------------------------------------------------------


def test_ensure_creates_exactly_the_reserved_instance_once_under_the_apply_lock(tmp_path):
    nv = nvml()
    mgr, (card,) = manager(nv, tmp_path)
    seen = []
    real_create = mgr.nvml.create

    def create(*args):
        seen.append(mgr.apply_lock.exists())
        return real_create(*args)

    mgr.nvml.create = create
    inst, created = mgr.ensure(card.uuid, "2g.10gb", P(2, 2))
    assert created and seen == [True] and not mgr.apply_lock.exists()
    assert nv.instances(0) == [("2g.10gb", 2, inst.gi_id, inst.ci_id, inst.mig_uuid)]
    again, created = mgr.ensure(card.uuid, "2g.10gb", P(2, 2))
    assert (again, created) == (inst, False)
    ledger = json.loads((tmp_path / "mig" / "instances.json").read_text())
    assert ledger == [{"gpu": card.uuid, "profile": "2g.10gb", "start": 2, "size": 2, "gi": inst.gi_id,
                       "ci": inst.ci_id, "mig": inst.mig_uuid}]  # fmt: skip
    with pytest.raises(MigError, match="overlap|is there") as e:
        mgr.ensure(card.uuid, "3g.20gb", P(0, 4))
    assert e.value.reason == "placement_taken"
    with pytest.raises(MigError, match="NVML allows 2g.10gb only at 0\\+2, 2\\+2, 4\\+2"):
        mgr.ensure(card.uuid, "2g.10gb", P(1, 2))
    with pytest.raises(MigError, match="offers no such profile"):
        mgr.ensure(card.uuid, "5g.30gb", P(0, 4))  # NVML has no such profile


def test_a_stale_apply_lock_is_removed_at_start(tmp_path):
    lock = tmp_path / "lock" / "hami-mig-apply.lock"
    lock.parent.mkdir()
    lock.touch()
    manager(nvml(), tmp_path)
    assert not lock.exists()


def _alloc(
    card: str, profile: str, start: int, size: int, inst=None, c: int = 0, d: int = 0
) -> MigAllocation:
    if inst is None:
        return MigAllocation(c, d, card, profile, P(start, size))
    return MigAllocation(c, d, card, profile, P(start, size), inst.mig_uuid, inst.gi_id, inst.ci_id)


def test_reconcile_destroys_only_idle_instances_nobody_reserves(tmp_path):
    nv = nvml()
    mgr, (card,) = manager(nv, tmp_path)
    kept, _ = mgr.ensure(card.uuid, "2g.10gb", P(0, 2))
    gone, _ = mgr.ensure(card.uuid, "1g.5gb", P(6, 1))
    busy, _ = mgr.ensure(card.uuid, "1g.5gb", P(5, 1))
    nv.run_process(busy.mig_uuid, 4242)
    active = {(card.uuid, "2g.10gb", P(0, 2)): _alloc(card.uuid, "2g.10gb", 0, 2)}
    r = mgr.reconcile(active)
    assert [i.mig_uuid for i in r.destroyed] == [gone.mig_uuid]
    assert [i.mig_uuid for i in r.busy] == [busy.mig_uuid]
    assert r.foreign == {}
    assert {i[4] for i in nv.instances(0)} == {kept.mig_uuid, busy.mig_uuid}
    nv.stop_processes(busy.mig_uuid)
    mgr.reconcile(active)
    assert {i[4] for i in nv.instances(0)} == {kept.mig_uuid}


def test_restart_keeps_and_adopts_live_instances_and_reports_foreign_ones(tmp_path):
    nv = nvml()
    mgr, (card,) = manager(nv, tmp_path)
    ours, _ = mgr.ensure(card.uuid, "2g.10gb", P(0, 2))
    # a restart with the ledger: the instance is still ours
    again, _ = manager(nv, tmp_path)
    assert [i.mig_uuid for i in again.owned()] == [ours.mig_uuid]
    # a restart that lost the ledger: the pod's recorded runtime identity adopts it
    (tmp_path / "mig" / "instances.json").unlink()
    lost, _ = manager(nv, tmp_path)
    assert [i.mig_uuid for i in lost.foreign(card.uuid)] == [ours.mig_uuid]
    record = _alloc(card.uuid, "2g.10gb", 0, 2, ours)
    r = lost.reconcile({(card.uuid, "2g.10gb", P(0, 2)): record})
    assert [i.mig_uuid for i in r.adopted] == [ours.mig_uuid] and r.foreign == {} and r.destroyed == []
    # an administrator's instance is foreign: reported, never destroyed
    theirs = nv.admin_create(0, "1g.5gb", 6)
    r = lost.reconcile({(card.uuid, "2g.10gb", P(0, 2)): record})
    assert [i.mig_uuid for i in r.foreign[card.uuid]] == [theirs] and r.destroyed == []
    r = lost.reconcile({})
    assert [i.mig_uuid for i in r.destroyed] == [ours.mig_uuid]
    assert [i[4] for i in nv.instances(0)] == [theirs]


def test_a_reboot_drops_the_stale_ledger_and_the_reservation_is_made_again(tmp_path):
    nv = nvml()
    mgr, (card,) = manager(nv, tmp_path)
    before, _ = mgr.ensure(card.uuid, "2g.10gb", P(0, 2))
    nv.reboot()
    after_boot, _ = manager(nv, tmp_path)
    record = _alloc(card.uuid, "2g.10gb", 0, 2, before)
    r = after_boot.reconcile({(card.uuid, "2g.10gb", P(0, 2)): record})
    assert r.adopted == [] and r.foreign == {} and after_boot.owned() == []
    made, created = after_boot.ensure(card.uuid, "2g.10gb", P(0, 2))
    assert created and made.mig_uuid != before.mig_uuid and made.placement == P(0, 2)


def test_active_allocations_come_from_our_live_pods_only():
    rec = A.encode_mig_allocations([MigAllocation(0, 0, "GPU-a", "1g.5gb", P(6, 1))])

    def pod(name, *, phase="Running", scheduler="hami-scheduler", value=rec, node="n1"):
        return {
            "metadata": {"name": name, "namespace": "default", "annotations": {A.ASSIGNED_NODE: node, A.MIG_ALLOCATIONS: value}},
            "spec": {"schedulerName": scheduler, "nodeName": node}, "status": {"phase": phase},
        }  # fmt: skip

    got = active_allocations(
        [pod("a"), pod("done", phase="Succeeded"), pod("other", scheduler="default-scheduler")],
        node_name="n1", scheduler_name="hami-scheduler",
    )  # fmt: skip
    assert list(got) == [("GPU-a", "1g.5gb", P(6, 1))]
    with pytest.raises(A.AnnotationError, match="pod default/bad"):
        active_allocations([pod("bad", value="[{")], node_name="n1", scheduler_name="hami-scheduler")


# -- MPS -------------------------------------------------------------------------------------


def test_mps_client_environment_follows_the_containers_shares():
    assert mps_env(ContainerDevice("GPU-a", "NVIDIA", 8000, 30)) == {
        "CUDA_MPS_PIPE_DIRECTORY": "/tmp/nvidia-mps", "CUDA_MPS_LOG_DIRECTORY": "/tmp/nvidia-log",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=8000M", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "30",
    }  # fmt: skip
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" not in mps_env(ContainerDevice("GPU-a", "NVIDIA", 8000, 0))
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" not in mps_env(ContainerDevice("GPU-a", "NVIDIA", 8000, 100))


FAKE_MPS_CONTROL = textwrap.dedent(
    """\
    import os, sys, time, pathlib
    pipe = pathlib.Path(os.environ["CUDA_MPS_PIPE_DIRECTORY"])
    log = pathlib.Path(os.environ["CUDA_MPS_LOG_DIRECTORY"])
    if sys.argv[1:] == ["-f"]:
        (log / "control.log").open("a").write(f"start {os.getpid()} {os.environ['CUDA_VISIBLE_DEVICES']}\\n")
        (pipe / "control").write_text(str(os.getpid()))
        while not (pipe / "quit").exists():
            time.sleep(0.02)
        (pipe / "quit").unlink()
        (pipe / "control").unlink()
    else:
        if sys.stdin.read().strip() == "quit":
            (pipe / "quit").touch()
    """
)


async def test_mps_daemon_is_started_per_card_restarted_when_it_dies_and_quit_at_stop(tmp_path):
    control = tmp_path / "nvidia-cuda-mps-control"
    control.write_text(f"#!{sys.executable}\n{FAKE_MPS_CONTROL}")
    control.chmod(0o755)
    d = MpsDaemon("GPU-a", tmp_path / "mps", control=str(control), backoff_s=(0.05, 0.1))
    task = asyncio.create_task(d.run())
    assert await d.ready(5)
    first = d.proc.pid
    assert (d.log_dir / "control.log").read_text().split() == ["start", str(first), "GPU-a"]
    d.proc.kill()  # the daemon dies
    for _ in range(200):
        if d.restarts and d.running and d.proc.pid != first and (d.pipe_dir / "control").exists():
            break
        await asyncio.sleep(0.02)
    assert d.restarts == 1 and d.proc.pid != first
    await d.stop()
    await asyncio.wait_for(task, 5)
    assert d.proc.returncode == 0  # it quit when asked through its pipe, it was not killed
    assert not (d.pipe_dir / "control").exists()


async def test_mps_daemon_output_never_goes_through_a_tenants_link(tmp_path):
    # The card's log directory is mounted read-write into its containers: a tenant can leave a link at
    # daemon.out, and the plugin (root) opens that file again whenever it starts the daemon.
    control = tmp_path / "nvidia-cuda-mps-control"
    control.write_text(
        f"#!{sys.executable}\nimport sys, time\nprint('daemon says hello', flush=True)\ntime.sleep(30)\n"
    )
    control.chmod(0o755)
    d = MpsDaemon("GPU-a", tmp_path / "mps", control=str(control), backoff_s=(0.05, 0.1))
    d.log_dir.mkdir(parents=True)
    victim = tmp_path / "ld.so.preload"
    victim.write_text("/usr/local/vgpu/libvgpu.so\n")
    (d.log_dir / "daemon.out").symlink_to(victim)
    task = asyncio.create_task(d.run())
    try:
        for _ in range(250):
            out = d.log_dir / "daemon.out"
            if not out.is_symlink() and out.exists() and "hello" in out.read_text():
                break
            await asyncio.sleep(0.02)
        assert victim.read_text() == "/usr/local/vgpu/libvgpu.so\n"
        assert not (d.log_dir / "daemon.out").is_symlink()
        assert "daemon says hello" in (d.log_dir / "daemon.out").read_text()
    finally:
        d.proc.kill()
        await d.stop()
        await asyncio.wait_for(task, 5)
