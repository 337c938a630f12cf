"""Bytes a tenant writes into the per-card region must never stall, starve or crash another.

The card file is mounted read-write into every container on the card, so any tenant can write
any bytes into it. These tests write wedged locks, random bytes and a stream of random writes
while other tenants launch, and check that those tenants finish their work (within a timeout far
above what the work takes) and exit cleanly. No share or timing is asserted: only that nothing
waits forever, no launch fails and no process dies of a signal.
"""

from __future__ import annotations

import fcntl
import mmap
import os
import random
import struct
import threading
import time

import pytest

from .conftest import parse
from .test_card import UUID0

SIZE = 256 + 64 * 128
HEADER = struct.pack("<6I", 0x44524356, 1, 1, 256, 128, 64)  # magic, major, minor, sizes, tenants
ENV = {"FAKE_KERNEL_US": "1000", "LIBVGPU_SM_SLICE_MS": "20", "CUDA_DEVICE_SM_LIMIT": "50"}


@pytest.fixture
def card(cli):
    d = cli.tmp / "cards"
    d.mkdir()
    f = d / f"{UUID0}.card"
    f.touch()
    return f


def tenant(cli, card, name, ms=300, **extra):
    env = {**ENV, "LIBVGPU_CARD_DIR": str(card.parent),
           "CUDA_DEVICE_MEMORY_SHARED_CACHE": str(cli.tmp / f"{name}.cache"), **extra}  # fmt: skip
    return cli.popen("init", "burn", str(ms), "launch", "3", "sync", env=env)


def finished(p, timeout=40):
    try:
        out, err = p.communicate(timeout=timeout)
    except BaseException:
        p.kill()
        p.wait()
        raise
    r = parse(p.returncode, out, err)
    assert r.returncode == 0, (r.returncode, r.stderr[-2000:])
    assert r.codes("burn") == [0] and r.codes("launch") == [0] and r.codes("sync") == [0], r.lines
    return r


def wedged_lock() -> bytes:
    # A holder killed between taking the lock word and storing lock_ns: lock 1, lock_ns 0.
    raw = bytearray(HEADER.ljust(SIZE, b"\0"))
    struct.pack_into("<IIQ", raw, 24, 1, 0, 0)
    return bytes(raw)


def garbage(seed: int) -> bytes:
    rng = random.Random(seed)
    raw = bytearray(rng.randbytes(SIZE))
    if seed % 2 == 0:
        raw[: len(HEADER)] = HEADER  # past the magic check: every field after it is garbage
    if seed % 3 == 0:
        struct.pack_into("<I", raw, 24, 1)  # and the lock held
    return bytes(raw)


@pytest.mark.parametrize(
    "content",
    [wedged_lock(), HEADER.ljust(SIZE, b"\xff"), *(garbage(s) for s in range(6))],
    ids=["wedged-lock", "all-ones", *(f"random{s}" for s in range(6))],
)
def test_tenants_launch_whatever_bytes_the_card_file_holds(cli, card, content):
    # Before, a wedged lock (lock 1, lock_ns 0) made every SM-limited tenant spin in its first
    # launch until an admin deleted the file.
    card.write_bytes(content)
    procs = [tenant(cli, card, f"t{i}") for i in range(2)]
    for p in procs:
        finished(p)


def test_tenants_survive_a_neighbour_scribbling_on_the_card_file(cli, card):
    card.write_bytes(HEADER.ljust(SIZE, b"\0"))
    stop = threading.Event()

    def scribble():
        rng = random.Random(7)
        with open(card, "r+b") as f, mmap.mmap(f.fileno(), SIZE) as m:
            while not stop.is_set():
                at = rng.randrange(0, SIZE - 8)
                m[at : at + 8] = rng.randbytes(8)
                if rng.random() < 0.05:
                    struct.pack_into("<IIQ", m, 24, 1, 0, rng.choice([0, 1, 2**64 - 1]))
                stop.wait(0.0005)

    t = threading.Thread(target=scribble)
    t.start()
    try:
        procs = [tenant(cli, card, f"s{i}", ms=600) for i in range(2)]
        procs.append(tenant(cli, card, "free", ms=600, CUDA_DEVICE_SM_LIMIT="100"))
        for p in procs:
            finished(p)
    finally:
        stop.set()
        t.join()


def test_a_neighbour_holding_a_file_lock_on_the_card_file_stalls_no_one(cli, card):
    # Before, the first launch took a blocking fcntl lock on the card file to format it, so a
    # tenant that held one (any tenant can: the file is mounted read-write) stalled every
    # neighbour's first launch for as long as it held it.
    with open(card, "r+b") as f:
        fcntl.lockf(f, fcntl.LOCK_EX)
        try:
            procs = [tenant(cli, card, f"l{i}") for i in range(2)]
            for p in procs:
                finished(p, timeout=20)
        finally:
            fcntl.lockf(f, fcntl.LOCK_UN)


def test_a_neighbour_truncating_the_card_file_crashes_no_one(cli, card):
    # The pages of a shared mapping past the end of its file fault (SIGBUS) in every process that
    # touches them; before, a tenant that truncated the card file killed its neighbours.
    procs = [tenant(cli, card, f"x{i}", ms=1500) for i in range(2)]
    for p in procs:
        assert p.stdout.readline().split() == ["init", "0"]
    deadline = time.monotonic() + 10
    while card.stat().st_size < SIZE and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.2)  # both are launching, attached to the region
    os.truncate(card, 0)
    for p in procs:
        finished(p)
