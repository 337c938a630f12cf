"""Legacy IPC inside one container is charged once: an allocation exported with cuIpcGetMemHandle
and opened by other processes of the same container (same region) counts once while any of them
holds it, moves to a remaining holder when its charger lets go (free, exit, kill -9), and is given
back when the last holder closes it. An import from another container is charged to the importer.
A corrupted table fails closed: the import is charged as a foreign one.

Each case runs real processes of t_cli against the fake driver, whose IPC model is shared by the
processes of one card (an exported allocation's memory lives until its exporter has freed it and
every import is closed).
"""

from __future__ import annotations

import fcntl
import signal
import struct
from contextlib import contextmanager
from pathlib import Path

from .conftest import CUDA_ERROR_OUT_OF_MEMORY, CUDA_SUCCESS, MIB
from .region import read_region
from .test_multiproc import wait_line

GIB = 1024 * MIB
ENV = {"CUDA_DEVICE_MEMORY_LIMIT": "4g", "FAKE_GPU_MIB": "16384"}


def usage(cache: Path) -> int:
    """Bytes the container's live slots hold on device 0 (what the monitor sums)."""
    return sum(s.used[0] for s in read_region(cache).slots if s.pid > 0)


def stop(*procs) -> None:
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.communicate(timeout=20)


@contextmanager
def exported(cli, size: str, env: dict[str, str] = ENV):
    """A process holding an allocation of `size` that it exported; yields the handle's file."""
    handle = cli.tmp / "h"
    exporter = cli.popen("init", "alloc", size, "ipcexport", "0", str(handle), "hold", env=env)
    try:
        wait_line(exporter, "hold")
        yield handle
    finally:
        stop(exporter)


def test_import_within_the_container_is_not_charged_twice(cli):
    with exported(cli, "3g") as handle:
        r = cli.run("init", "ipcimport", str(handle), "meminfo", "free", "0", "meminfo", env=ENV)
    assert r.codes("ipcimport") == [CUDA_SUCCESS]  # 3 + 3 GiB under 4 GiB: refused when counted twice
    assert r.op(2) == ["meminfo", "0", str(1 * GIB), str(4 * GIB)]
    assert r.codes("free") == [CUDA_SUCCESS]  # cuIpcCloseMemHandle
    assert r.op(4) == ["meminfo", "0", str(1 * GIB), str(4 * GIB)]  # the exporter still holds it


def test_exporter_frees_while_imported_then_importer_closes(cli):
    handle, go_free, go_close = cli.tmp / "h", cli.tmp / "free", cli.tmp / "close"
    exporter = cli.popen("init", "alloc", "3g", "ipcexport", "0", str(handle), "waitfile", str(go_free),
                         "free", "0", "hold", env=ENV)  # fmt: skip
    importer = cli.popen(
        "init", "ipcimport", str(handle), "waitfile", str(go_close), "free", "0", "hold", env=ENV
    )
    try:
        assert wait_line(importer, "ipcimport").split()[1] == str(CUDA_SUCCESS)
        assert usage(cli.cache) == 3 * GIB
        go_free.touch()
        assert wait_line(exporter, "free").split()[1] == str(CUDA_SUCCESS)
        # the importer keeps the memory mapped: the charge moved to it, nothing was given back
        assert usage(cli.cache) == 3 * GIB
        probe = cli.run("init", "alloc", "2g", env=ENV)
        assert probe.codes("alloc") == [CUDA_ERROR_OUT_OF_MEMORY]
        go_close.touch()
        assert wait_line(importer, "free").split()[1] == str(CUDA_SUCCESS)
        assert usage(cli.cache) == 0
    finally:
        stop(exporter, importer)
    assert cli.run("init", "alloc", "4g", env=ENV).codes("alloc") == [CUDA_SUCCESS]


def test_import_from_another_container_is_charged_to_the_importer(cli):
    other = {**ENV, "CUDA_DEVICE_MEMORY_SHARED_CACHE": str(cli.tmp / "other.cache")}
    with exported(cli, "3g", other) as handle:
        r = cli.run("init", "ipcimport", str(handle), "meminfo", "alloc", "2g", env=ENV)
    assert r.codes("ipcimport") == [CUDA_SUCCESS]
    assert r.op(2) == ["meminfo", "0", str(1 * GIB), str(4 * GIB)]
    assert r.codes("alloc") == [CUDA_ERROR_OUT_OF_MEMORY]


def test_killed_exporter_leaves_the_charge_with_the_importer(cli):
    handle, go = cli.tmp / "h", cli.tmp / "go"
    exporter = cli.popen("init", "alloc", "3g", "ipcexport", "0", str(handle), "hold", env=ENV)
    importer = cli.popen("init", "ipcimport", str(handle), "waitfile", str(go), "alloc", "2g", "meminfo",
                         "free", "0", "meminfo", "hold", env=ENV)  # fmt: skip
    try:
        wait_line(exporter, "hold")
        assert wait_line(importer, "ipcimport").split()[1] == str(CUDA_SUCCESS)
        exporter.send_signal(signal.SIGKILL)
        exporter.wait()
        go.touch()
        lines = [wait_line(importer, op).split() for op in ("alloc", "meminfo", "free", "meminfo")]
    finally:
        stop(exporter, importer)
    assert lines[0][:2] == ["alloc", str(CUDA_ERROR_OUT_OF_MEMORY)]  # the dead exporter's 3 GiB stay charged
    assert lines[1] == ["meminfo", "0", str(1 * GIB), str(4 * GIB)]
    assert lines[2] == ["free", str(CUDA_SUCCESS)]
    assert lines[3] == ["meminfo", "0", str(4 * GIB), str(4 * GIB)]


def test_garbage_in_the_table_charges_the_import(cli):
    with exported(cli, "1g") as handle:
        table = Path(str(cli.cache) + ".ipc")
        size = table.stat().st_size
        assert size > 0
        table.write_bytes(bytes((i * 131 + 7) & 0xFF for i in range(size)))
        r = cli.run("init", "ipcimport", str(handle), "meminfo", "free", "0", "meminfo", env=ENV)
        assert r.returncode == 0
        assert r.codes("ipcimport") == [CUDA_SUCCESS]
        assert r.op(2) == ["meminfo", "0", str(2 * GIB), str(4 * GIB)]  # charged as a foreign import
        assert r.op(4) == ["meminfo", "0", str(3 * GIB), str(4 * GIB)]


def test_entry_out_of_range_charges_the_import(cli):
    # a sane header, but the entry's charger names no holder and its size is absurd
    with exported(cli, "1g") as handle:
        table = Path(str(cli.cache) + ".ipc")
        raw = bytearray(table.read_bytes())
        assert struct.unpack_from("<I", raw, 0)[0] == 0x43504956
        entry = 256  # the first entry
        assert struct.unpack_from("<I", raw, entry)[0] == 1
        struct.pack_into("<Q", raw, entry + 16, 1 << 62)
        struct.pack_into("<i", raw, entry + 88, 99)
        table.write_bytes(bytes(raw))
        r = cli.run("init", "ipcimport", str(handle), "meminfo", env=ENV)
        assert r.codes("ipcimport") == [CUDA_SUCCESS]
        assert r.op(2) == ["meminfo", "0", str(2 * GIB), str(4 * GIB)]


def test_table_locked_by_another_process_does_not_block_the_import(cli):
    # a process of the container that holds the table's lock forever: the import gives up waiting
    # (bounded) and is charged as a foreign one
    with exported(cli, "1g") as handle:
        with open(str(cli.cache) + ".ipc", "r+b") as f:
            fcntl.lockf(f, fcntl.LOCK_EX)
            r = cli.run("init", "ipcimport", str(handle), "meminfo", env=ENV, timeout=30)
        assert r.codes("ipcimport") == [CUDA_SUCCESS]
        assert r.op(2) == ["meminfo", "0", str(2 * GIB), str(4 * GIB)]


def test_table_file_that_is_a_symlink_is_not_followed(cli):
    target = cli.tmp / "elsewhere"
    target.write_bytes(b"")
    Path(str(cli.cache) + ".ipc").symlink_to(target)
    with exported(cli, "3g") as handle:
        r = cli.run("init", "ipcimport", str(handle), env=ENV)
    assert target.stat().st_size == 0
    assert r.codes("ipcimport") == [CUDA_ERROR_OUT_OF_MEMORY]  # no table: charged as foreign


def test_charge_moves_to_the_next_holder_at_exit_and_close(cli):
    # exporter exits normally (atexit) while two importers hold it; the charge hops from holder to
    # holder and is given back with the last one
    handle, go, first, second = cli.tmp / "h", cli.tmp / "go", cli.tmp / "c1", cli.tmp / "c2"
    exporter = cli.popen("init", "alloc", "3g", "ipcexport", "0", str(handle), "waitfile", str(go), env=ENV)
    imp1 = cli.popen("init", "ipcimport", str(handle), "waitfile", str(first), "free", "0", "hold", env=ENV)
    imp2 = cli.popen("init", "ipcimport", str(handle), "waitfile", str(second), "free", "0", "hold", env=ENV)
    try:
        for p in (imp1, imp2):
            assert wait_line(p, "ipcimport").split()[1] == str(CUDA_SUCCESS)
        assert usage(cli.cache) == 3 * GIB
        go.touch()
        exporter.communicate(timeout=20)
        assert exporter.returncode == 0
        assert usage(cli.cache) == 3 * GIB
        first.touch()
        assert wait_line(imp1, "free").split()[1] == str(CUDA_SUCCESS)
        assert usage(cli.cache) == 3 * GIB
        second.touch()
        assert wait_line(imp2, "free").split()[1] == str(CUDA_SUCCESS)
        assert usage(cli.cache) == 0
    finally:
        stop(exporter, imp1, imp2)


def test_killed_last_holder_gives_the_charge_back(cli):
    # the exporter freed, the importer carried the charge and is killed: nobody holds the memory
    handle, go = cli.tmp / "h", cli.tmp / "go"
    exporter = cli.popen("init", "alloc", "3g", "ipcexport", "0", str(handle), "waitfile", str(go),
                         "free", "0", "hold", env=ENV)  # fmt: skip
    importer = cli.popen("init", "ipcimport", str(handle), "hold", env=ENV)
    try:
        assert wait_line(importer, "ipcimport").split()[1] == str(CUDA_SUCCESS)
        go.touch()
        assert wait_line(exporter, "free").split()[1] == str(CUDA_SUCCESS)
        assert usage(cli.cache) == 3 * GIB
        importer.send_signal(signal.SIGKILL)
        importer.wait()
        # the over-limit answer sweeps dead slots first; the charge went with its last holder
        assert cli.run("init", "alloc", "4g", env=ENV).codes("alloc") == [CUDA_SUCCESS]
    finally:
        stop(exporter, importer)
