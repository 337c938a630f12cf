"""One pass over the per-container cache directories -> an immutable `Snapshot` for the metrics.

Directory layout (made by the device plugin's Allocate): ``<containers-dir>/<podUID>_<container>/``
holding one ``*.cache`` region file (the name is the container's ``CUDA_DEVICE_MEMORY_SHARED_CACHE``).
A directory appears in the metrics once its pod is known to the pod index; until then it is skipped.

Removal of stale directories (HAMi's monitor does the same): a directory whose pod UID the *synced*
index does not know, for at least `grace_s` of our own observation and with an mtime older than
`grace_s`, is deleted - after `confirm_gone` (one list of this node's pods from the API server) agrees
that none of the candidate UIDs exists. A directory whose pod exists is never removed; an index that
has not synced yet, or a confirmation that fails, removes nothing.

Errors: a region that cannot be read (see `regions.REASONS`) is skipped with one log line and one
`on_error(reason)` call when the directory enters that state - not again on every scan while it stays
there, so the counter counts bad files, not scans.

Bounds: a region is written by the container it describes, so its figures are whatever a tenant
process put there. A device whose used, context, module, buffer or limit bytes exceed its card's
memory (from the host backend; `MAX_CARD_BYTES` for a card the host does not report) or whose
utilisation is outside 0-100 % is left out of the snapshot and counted once as ``out_of_range``
(the container's other devices are still exported). An unlimited limit (libvgpu's all-ones value)
is no limit, not a violation.

Utilisation of libvgpu containers is the growth of the device's ``busy_ns_total`` between two scans
over the wall time between them, in percent (0-100, HAMi's ``_ratio`` families carry percent); the
first scan of a device has no previous sample and exports none.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from device_plugin.monitor.host import HostBackend, HostGpu
from device_plugin.monitor.pods import PodIndex, PodRef
from device_plugin.monitor.procs import ProcTable
from device_plugin.monitor.regions import (
    MULTIPLE_FILES,
    OUT_OF_RANGE,
    DeviceReading,
    RegionError,
    read_region,
)

log = logging.getLogger(__name__)

CACHE_SUFFIX = ".cache"
#: The bound for a card the host backend does not report: 1 TiB, above any card's memory.
MAX_CARD_BYTES = 1 << 40


@dataclass(frozen=True)
class DeviceSample:
    """One device of one container as exported. Bytes, percent, seconds; None = not exported."""

    index: int
    uuid: str
    limit_bytes: int | None
    used_bytes: int
    context_bytes: int
    module_bytes: int
    buffer_bytes: int
    utilization_percent: float | None
    last_kernel_elapsed_s: float | None


@dataclass(frozen=True)
class ContainerSample:
    pod: PodRef
    container: str
    layout: str  # libvgpu-2, hami-core-v1, hami-core-v0
    devices: tuple[DeviceSample, ...]
    live_processes: int


@dataclass(frozen=True)
class Snapshot:
    """The result of one scan. `taken_at` is unix seconds; `scan_s` how long the scan took."""

    taken_at: float = 0.0
    containers: tuple[ContainerSample, ...] = ()
    host: tuple[HostGpu, ...] = ()
    unmatched_dirs: int = 0
    scan_s: float = 0.0


@dataclass
class _DirState:
    error: str | None = None  # reason of the last failed read, None after a good one
    missing_since: float | None = None  # monotonic time the pod was first seen missing
    busy: dict[str, tuple[int, int]] = field(default_factory=dict)  # uuid -> (busy ns, monotonic ns)


def out_of_range(d: DeviceReading, card_bytes: int) -> str | None:
    """Why device `d`'s figures cannot be true on a card of `card_bytes` bytes, or None when they can."""
    for what, value in (
        ("used", d.used_bytes), ("context", d.context_bytes), ("module", d.module_bytes),
        ("buffer", d.buffer_bytes), ("limit", d.limit_bytes),
    ):  # fmt: skip
        if value is not None and not 0 <= value <= card_bytes:
            return f"{what} {value} bytes is outside 0..{card_bytes} (the card's memory)"
    if d.sm_util_percent is not None and not 0 <= d.sm_util_percent <= 100:
        return f"utilisation {d.sm_util_percent} % is outside 0..100"
    return None


def parse_dir_name(name: str) -> tuple[str, str] | None:
    """``<podUID>_<container>`` -> (uid, container), or None for any other name.

    Pod UIDs contain no underscore and container names are DNS labels, so the first ``_`` splits.
    """
    uid, sep, container = name.partition("_")
    if not sep or not uid or not container:
        return None
    return uid, container


class Scanner:
    """Reads every cache directory under `containers_dir` (see module docstring). Not thread-safe:
    one scanning thread calls `scan()`.

    `on_error(reason)`: a region file entered a failed state. `on_removed(path)`: a stale directory was
    deleted. `confirm_gone(uids)`: the subset of `uids` that the API server confirms are gone (raise
    or return fewer to keep directories); None = trust the index alone.
    """

    def __init__(
        self,
        containers_dir: str | os.PathLike[str],
        pods: PodIndex,
        *,
        host: HostBackend | None = None,
        grace_s: float = 300.0,
        proc: str = "/proc",
        on_error: Callable[[str], None] = lambda reason: None,
        on_removed: Callable[[str], None] = lambda path: None,
        confirm_gone: Callable[[set[str]], Iterable[str]] | None = None,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.containers_dir = Path(containers_dir)
        self.pods = pods
        self.host = host
        self.grace_s = grace_s
        self.proc = proc
        self.on_error = on_error
        self.on_removed = on_removed
        self.confirm_gone = confirm_gone
        self.clock = clock
        self.monotonic = monotonic
        self._dirs: dict[str, _DirState] = {}
        self._dir_missing_logged = False

    # -- one scan -------------------------------------------------------------------------------------

    def scan(self) -> Snapshot:
        """Read every directory once; returns the new snapshot (never raises for a file or directory)."""
        t0 = time.perf_counter()
        now = self.clock()
        mono = self.monotonic()
        table = ProcTable(self.proc)
        synced = self.pods.synced  # read before the snapshot: a synced flag always goes with a full map
        pods = self.pods.snapshot()
        host = tuple(self.host.read()) if self.host is not None else ()
        capacity = {g.uuid: g.memory_total_bytes for g in host if g.memory_total_bytes > 0}
        samples: list[ContainerSample] = []
        unmatched = 0
        stale: dict[str, list[tuple[str, str]]] = {}  # uid -> its directories
        seen: set[str] = set()
        for name, path in self._list_dirs():
            parsed = parse_dir_name(name)
            if parsed is None:
                continue
            uid, container = parsed
            seen.add(name)
            st = self._dirs.setdefault(name, _DirState())
            ref = pods.get(uid)
            if ref is None:
                unmatched += 1
                if not synced:
                    continue  # absence counts only from a complete pod list on
                if st.missing_since is None:
                    st.missing_since = mono
                if mono - st.missing_since >= self.grace_s and self._old(path, now):
                    stale.setdefault(uid, []).append((name, path))
                continue
            st.missing_since = None
            sample = self._read_dir(name, path, st, ref, container, table, now, capacity)
            if sample is not None:
                samples.append(sample)
        for name in set(self._dirs) - seen:
            del self._dirs[name]
        if stale:
            self._remove(stale)
        return Snapshot(
            taken_at=now,
            containers=tuple(samples),
            host=host,
            unmatched_dirs=unmatched,
            scan_s=time.perf_counter() - t0,
        )

    # -- helpers --------------------------------------------------------------------------------------

    def _list_dirs(self) -> list[tuple[str, str]]:
        # Plain strings, not Path objects: with a thousand directories pathlib was a fifth of a scan.
        try:
            with os.scandir(self.containers_dir) as it:
                out = [(e.name, e.path) for e in it if e.is_dir(follow_symlinks=False)]
        except OSError as e:
            if not self._dir_missing_logged:
                log.warning(
                    "cannot list %s: %s; no container metrics until it exists", self.containers_dir, e
                )
                self._dir_missing_logged = True
            return []
        self._dir_missing_logged = False
        return out

    def _old(self, path: str, now: float) -> bool:
        try:
            return now - os.stat(path).st_mtime >= self.grace_s
        except OSError:
            return False

    def _cache_file(self, name: str, path: str, st: _DirState) -> str | None:
        try:
            with os.scandir(path) as it:
                files = [e for e in it if e.name.endswith(CACHE_SUFFIX) and e.is_file(follow_symlinks=False)]
        except OSError:
            return None
        if not files:
            return None  # the container has not made its first CUDA call yet
        if len(files) == 1:
            return files[0].path

        def mtime(e: os.DirEntry) -> float:
            try:
                return e.stat().st_mtime
            except OSError:  # removed since the listing
                return 0.0

        newest = max(files, key=mtime)
        self._fail(name, st, MULTIPLE_FILES, f"{len(files)} *.cache files; reading the newest, {newest.name}")
        return newest.path

    def _fail(self, name: str, st: _DirState, reason: str, message: str) -> None:
        if st.error != reason:
            st.error = reason
            log.warning("cache %s/%s skipped (%s): %s", self.containers_dir, name, reason, message)
            self.on_error(reason)

    def _read_dir(
        self,
        name: str,
        path: str,
        st: _DirState,
        ref: PodRef,
        container: str,
        table: ProcTable,
        now: float,
        capacity: dict[str, int] | None = None,
    ) -> ContainerSample | None:
        cache = self._cache_file(name, path, st)
        if cache is None:
            return None
        try:
            reading = read_region(cache, table)
        except RegionError as e:
            self._fail(name, st, e.reason, f"{os.path.basename(cache)}: {e}")
            return None
        kept, problems = [], []
        for d in reading.devices:
            problem = out_of_range(d, (capacity or {}).get(d.uuid, MAX_CARD_BYTES))
            if problem is None:
                kept.append(d)
            else:
                problems.append(f"device {d.index} ({d.uuid}): {problem}")
        if problems:
            self._fail(
                name, st, OUT_OF_RANGE, f"{os.path.basename(cache)}: not exported: {'; '.join(problems)}"
            )
        elif st.error is not None and st.error != MULTIPLE_FILES:
            log.info("cache %s/%s readable again (%s)", self.containers_dir, name, reading.layout)
            st.error = None
        return ContainerSample(
            pod=ref,
            container=container,
            layout=reading.layout,
            devices=self._devices(kept, st, now),
            live_processes=reading.live_processes,
        )

    def _devices(self, devices: list[DeviceReading], st: _DirState, now: float) -> tuple[DeviceSample, ...]:
        mono_ns = int(self.monotonic() * 1e9)
        out = []
        for d in devices:
            util = d.sm_util_percent
            if d.busy_ns_total is not None:
                util = None
                prev = st.busy.get(d.uuid)
                if prev is not None and d.busy_ns_total >= prev[0] and mono_ns > prev[1]:
                    util = min(100.0, 100.0 * (d.busy_ns_total - prev[0]) / (mono_ns - prev[1]))
                st.busy[d.uuid] = (d.busy_ns_total, mono_ns)
            elapsed = max(0.0, now - d.last_kernel_time) if d.last_kernel_time > 0 else None
            out.append(
                DeviceSample(
                    index=d.index,
                    uuid=d.uuid,
                    limit_bytes=d.limit_bytes,
                    used_bytes=d.used_bytes,
                    context_bytes=d.context_bytes,
                    module_bytes=d.module_bytes,
                    buffer_bytes=d.buffer_bytes,
                    utilization_percent=util,
                    last_kernel_elapsed_s=elapsed,
                )
            )
        return tuple(out)

    def _remove(self, stale: dict[str, list[tuple[str, str]]]) -> None:
        uids = set(stale)
        if self.confirm_gone is not None:
            try:
                uids &= set(self.confirm_gone(uids))
            except Exception as e:  # noqa: BLE001 - an unreachable API server must not remove anything
                log.warning(
                    "cannot confirm that pods %s are gone (%s); keeping their directories", sorted(uids), e
                )
                return
        for uid in sorted(uids):
            for name, path in stale[uid]:
                shutil.rmtree(path, ignore_errors=True)
                if os.path.exists(path):
                    log.warning("could not remove stale cache directory %s", path)
                    continue
                log.info(
                    "removed cache directory %s: pod %s gone for more than %.0fs", path, uid, self.grace_s
                )
                self._dirs.pop(name, None)
                self.on_removed(path)
