"""The MIG instances this device plugin owns: made at Allocate at exactly the placement the scheduler
reserved, remembered across restarts, removed when their pods are gone.

Rules (HAMi's dynamic MIG, made stricter where HAMi guesses):

- one mutation at a time per card (a lock per card), and while any card is being changed HAMi's apply
  lock file (``/tmp/hami/hami-mig-apply.lock``) exists, so the node monitor pauses its feedback loop
  and no NVML reader sees a half-made instance; a stale file from a crashed run is removed at start;
- an instance is created only at the reserved profile and placement, never at another one, and only
  where no instance overlaps it (an overlapping instance is an error naming it, not a retry elsewhere);
- ownership is a ledger file next to libvgpu (``<hook>/vgpu/mig/instances.json``): every instance the
  plugin made, by card, GPU-instance id, compute-instance id and MIG UUID. After a plugin restart the
  live instances are matched against it and against the pods' recorded runtime identity (`adopt`);
  after a reboot (instances gone) the stale entries drop out;
- `reconcile` is given the reservations of the live pods from a complete, successful pod list: an
  owned instance no such pod reserves is destroyed, unless a process still runs on it (then it is
  kept and tried again next time);
- any other instance on a card (made by an administrator, another tool, or a crashed run) is
  foreign: the card is left exactly as it is and reported, never changed, and takes no new instance.

HAMi enables MIG mode on idle cards and destroys every instance on them at start; this plugin never
changes MIG mode and never touches an instance it did not make.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from device_plugin.mig.nvml import Instance, MigNvml, ProfileInfo
from hami.annotations import MigAllocation
from hami.model import MigPlacement

log = logging.getLogger(__name__)

#: HAMi's MIG apply lock: present while MIG instances are being changed (pkg/device-plugin .../lock.go).
APPLY_LOCK = "/tmp/hami/hami-mig-apply.lock"

#: What one reservation is: the card, the profile and the placement (HAMi's allocation key).
Key = tuple[str, str, MigPlacement]


class MigError(Exception):
    """A reservation that cannot be realised; `reason` is a short code for metrics, `message` for people."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


@dataclass
class Reconciled:
    """What one reconciliation did: instances destroyed, kept because busy, adopted, and per card the
    foreign instances found."""

    destroyed: list[Instance] = field(default_factory=list)
    busy: list[Instance] = field(default_factory=list)
    adopted: list[Instance] = field(default_factory=list)
    foreign: dict[str, list[Instance]] = field(default_factory=dict)


def key_of(allocation: MigAllocation) -> Key:
    return (allocation.gpu_uuid, allocation.profile, allocation.placement)


class MigManager:
    """MIG instances on this node's cards (`cards`: UUID -> NVML handle getter) through `nvml`.

    Blocking methods (NVML, files): call them from a thread. Thread-safe.
    """

    def __init__(
        self,
        nvml: MigNvml,
        cards: Mapping[str, Callable[[], Any]],
        profiles: Mapping[str, list[ProfileInfo]],
        *,
        ledger: str | Path,
        apply_lock: str | Path = APPLY_LOCK,
    ) -> None:
        self.nvml = nvml
        self._handles = dict(cards)
        self._profiles = {u: list(ps) for u, ps in profiles.items()}
        self.ledger_path = Path(ledger)
        self.apply_lock = Path(apply_lock)
        self._locks = {u: threading.Lock() for u in self._handles}
        self._state = threading.Lock()  # the ledger and the count of mutations under way
        self._mutating = 0
        self._owned: dict[str, Instance] = {}  # MIG UUID -> instance
        self._load()
        self._clear_stale_lock()

    # -- the ledger -----------------------------------------------------------------------------

    def _load(self) -> None:
        try:
            raw = json.loads(self.ledger_path.read_text())
        except FileNotFoundError:
            return
        except (OSError, ValueError) as e:
            # Unreadable: ownership is unknown, so every instance counts as foreign until adopted.
            log.warning(
                "MIG ledger %s unreadable (%s); live instances must be adopted from the pods",
                self.ledger_path,
                e,
            )
            return
        for e in raw if isinstance(raw, list) else []:
            try:
                inst = Instance(
                    gpu_uuid=str(e["gpu"]), profile=str(e["profile"]),
                    placement=MigPlacement(int(e["start"]), int(e["size"])),
                    gi_id=int(e["gi"]), ci_id=None if e.get("ci") is None else int(e["ci"]), mig_uuid=str(e["mig"]),
                )  # fmt: skip
            except (KeyError, TypeError, ValueError):
                log.warning("MIG ledger %s: skipping malformed entry %r", self.ledger_path, e)
                continue
            self._owned[inst.mig_uuid] = inst

    def _save(self) -> None:
        rows = [
            {"gpu": i.gpu_uuid, "profile": i.profile, "start": i.placement.start, "size": i.placement.size,
             "gi": i.gi_id, "ci": i.ci_id, "mig": i.mig_uuid}
            for i in sorted(self._owned.values(), key=lambda i: (i.gpu_uuid, i.placement.start))
        ]  # fmt: skip
        self.ledger_path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.ledger_path.parent, prefix=".instances.")
        with os.fdopen(fd, "w") as f:
            json.dump(rows, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.ledger_path)  # a crash leaves the old or the new ledger, never half of one

    def owned(self) -> list[Instance]:
        """The instances this plugin made and still owns (as the ledger says)."""
        with self._state:
            return sorted(self._owned.values(), key=lambda i: (i.gpu_uuid, i.placement.start))

    # -- the apply lock and per-card serialisation -----------------------------------------------

    def _clear_stale_lock(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.apply_lock.unlink()
            log.info("removed a stale MIG apply lock %s", self.apply_lock)

    @contextlib.contextmanager
    def _changing(self, gpu_uuid: str) -> Iterator[Any]:
        """The card's lock held and the apply lock file present for as long as a change is under way."""
        lock = self._locks.get(gpu_uuid)
        if lock is None:
            raise MigError("unknown_card", f"card {gpu_uuid} is not a MIG card of this node")
        with lock:
            with self._state:
                self._mutating += 1
                if self._mutating == 1:
                    self.apply_lock.parent.mkdir(parents=True, exist_ok=True)
                    self.apply_lock.touch()
            try:
                yield self._handles[gpu_uuid]()
            finally:
                with self._state:
                    self._mutating -= 1
                    if self._mutating == 0:
                        with contextlib.suppress(FileNotFoundError):
                            self.apply_lock.unlink()

    # -- reading ----------------------------------------------------------------------------------

    def profiles(self, gpu_uuid: str) -> list[ProfileInfo]:
        return list(self._profiles.get(gpu_uuid, ()))

    def live(self, gpu_uuid: str) -> list[Instance]:
        """The card's instances as NVML sees them now."""
        return self.nvml.instances(self._handles[gpu_uuid](), gpu_uuid, self._profiles.get(gpu_uuid, []))

    def foreign(self, gpu_uuid: str, live: Iterable[Instance] | None = None) -> list[Instance]:
        """Live instances of the card this plugin does not own."""
        with self._state:
            owned = {(i.gi_id, i.mig_uuid) for i in self._owned.values() if i.gpu_uuid == gpu_uuid}
        return [
            i for i in (self.live(gpu_uuid) if live is None else live) if (i.gi_id, i.mig_uuid) not in owned
        ]

    # -- changing ---------------------------------------------------------------------------------

    def ensure(self, gpu_uuid: str, profile: str, placement: MigPlacement) -> tuple[Instance, bool]:
        """The owned instance of `profile` at `placement` on the card, made now if there is none; and
        whether this call made it. Raises MigError naming the card, profile, placement and cause."""
        where = f"MIG {profile} at slices {placement.start}..{placement.start + placement.size - 1} on card {gpu_uuid}"
        with self._state:
            for i in self._owned.values():
                if (i.gpu_uuid, i.profile, i.placement) == (gpu_uuid, profile, placement):
                    return i, False
        prof = next((p for p in self._profiles.get(gpu_uuid, ()) if p.name == profile), None)
        if prof is None:
            raise MigError("unknown_profile", f"{where}: the card offers no such profile (its profiles: "
                           f"{', '.join(p.name for p in self._profiles.get(gpu_uuid, ()))})")  # fmt: skip
        if placement not in prof.placements:
            raise MigError("bad_placement", f"{where}: NVML allows {profile} only at "
                           f"{', '.join(f'{p.start}+{p.size}' for p in prof.placements)}")  # fmt: skip
        with self._changing(gpu_uuid) as handle:
            live = self.nvml.instances(handle, gpu_uuid, self._profiles[gpu_uuid])
            overlap = [i for i in live if i.placement.overlaps(placement)]
            if overlap:
                o = overlap[0]
                raise MigError(
                    "placement_taken",
                    f"{where}: instance {o.mig_uuid or 'gi ' + str(o.gi_id)} ({o.profile} at slices "
                    f"{o.placement.start}..{o.placement.start + o.placement.size - 1}) is there",
                )
            try:
                inst = self.nvml.create(handle, gpu_uuid, prof, placement)
            except self.nvml.nv.NVMLError as e:
                raise MigError("nvml", f"{where}: NVML refused to create it: {e}") from None
            with self._state:
                self._owned[inst.mig_uuid] = inst
                self._save()
        log.info("created %s: %s (gi %d, ci %s)", where, inst.mig_uuid, inst.gi_id, inst.ci_id)
        return inst, True

    def release(self, instance: Instance) -> None:
        """Destroy an owned instance (the roll-back of an Allocate that failed half way)."""
        with self._changing(instance.gpu_uuid) as handle:
            self.nvml.destroy(handle, instance.gi_id, instance.ci_id)
            with self._state:
                self._owned.pop(instance.mig_uuid, None)
                self._save()

    def adopt(self, allocation: MigAllocation) -> Instance | None:
        """Own the live instance a pod's recorded runtime identity names (after a restart that lost the
        ledger): same card, profile, placement, GPU- and compute-instance id and MIG UUID. None when no
        live instance matches exactly."""
        if not allocation.realized or allocation.gpu_uuid not in self._handles:
            return None
        with self._state:
            if allocation.mig_uuid in self._owned:
                return self._owned[allocation.mig_uuid]
        for i in self.live(allocation.gpu_uuid):
            if (i.profile, i.placement, i.gi_id, i.ci_id, i.mig_uuid) == (
                allocation.profile, allocation.placement, allocation.gpu_instance_id,
                allocation.compute_instance_id, allocation.mig_uuid,
            ):  # fmt: skip
                inst = Instance(i.gpu_uuid, i.profile, i.placement, i.gi_id, i.ci_id, i.mig_uuid)
                with self._state:
                    self._owned[inst.mig_uuid] = inst
                    self._save()
                log.info(
                    "adopted MIG instance %s on card %s from its pod's record", inst.mig_uuid, inst.gpu_uuid
                )
                return inst
        return None

    def reconcile(self, active: Mapping[Key, MigAllocation]) -> Reconciled:
        """Bring the owned instances in line with `active`, the reservations of every live pod of this
        node from a complete pod list (never call it after a failed or partial list).

        Adopts live instances the pods' runtime identity names; destroys owned instances no
        reservation names unless busy; drops ledger entries whose instance is gone; reports foreign
        instances per card. Raises nothing for one card's NVML failure (logged, tried next time).
        """
        out = Reconciled()
        for a in active.values():
            with contextlib.suppress(MigError):
                inst = None if a.mig_uuid in {i.mig_uuid for i in self.owned()} else self.adopt(a)
                if inst is not None:
                    out.adopted.append(inst)
        for gpu_uuid in self._handles:
            try:
                self._reconcile_card(gpu_uuid, active, out)
            except self.nvml.nv.NVMLError as e:
                log.warning("MIG reconciliation of card %s skipped: %s", gpu_uuid, e)
        return out

    def _reconcile_card(self, gpu_uuid: str, active: Mapping[Key, MigAllocation], out: Reconciled) -> None:
        live = self.live(gpu_uuid)
        by_uuid = {i.mig_uuid: i for i in live if i.mig_uuid}
        for inst in [i for i in self.owned() if i.gpu_uuid == gpu_uuid]:
            now = by_uuid.get(inst.mig_uuid)
            if now is None or now.gi_id != inst.gi_id:
                with self._state:  # gone (a reboot, or removed by hand): forget it
                    self._owned.pop(inst.mig_uuid, None)
                    self._save()
                continue
            if (gpu_uuid, inst.profile, inst.placement) in active:
                continue
            if now.busy or self.nvml.busy(inst.mig_uuid):
                log.warning("MIG instance %s on card %s: its pod is gone but a process still runs on it; kept",
                            inst.mig_uuid, gpu_uuid)  # fmt: skip
                out.busy.append(now)
                continue
            with self._changing(gpu_uuid) as handle:
                self.nvml.destroy(handle, inst.gi_id, inst.ci_id)
                with self._state:
                    self._owned.pop(inst.mig_uuid, None)
                    self._save()
            log.info("destroyed MIG instance %s (%s) on card %s: no live pod reserves it", inst.mig_uuid,
                     inst.profile, gpu_uuid)  # fmt: skip
            out.destroyed.append(now)
        foreign = self.foreign(gpu_uuid, self.live(gpu_uuid) if out.destroyed else live)
        if foreign:
            out.foreign[gpu_uuid] = foreign


__all__ = ["APPLY_LOCK", "Key", "MigError", "MigManager", "Reconciled", "key_of"]
