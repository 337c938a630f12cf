"""The device plugin's own record of what it served: per pod UID, each container's cards and limits
and the node's boot ID at that time, in files on the host that no container mounts.

Why: after a node reboot kubelet may call Allocate again for containers it had admitted before, with
no node lock held and no pod named. What may be served again then must come from something no pod
owner can write: not the pod's annotations (its owner can edit them, or copy them onto a decoy pod
bound to the node by hand), but this record, written by the plugin when it served the container
through the lock. A container is served again only when the node's boot ID differs from the one
recorded when it was served (a reboot is proven, not assumed: a kubelet or plugin restart keeps the
boot ID), and then only once per boot: serving it stamps the record with the current boot ID.

Layout: ``<dir>/<pod UID>.json`` (0600 in a 0700 directory), written whole and renamed into place:
``{"uid", "namespace", "name", "containers": {"<index>": {"name", "devices", "boot_id"}}}`` with
``devices`` in HAMi's container device form (``uuid,NVIDIA,MiB,percent:``). A file that cannot be
read is skipped (and logged); records of pods that no longer exist are removed by `ServedRecords.prune`.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from hami import annotations as ann
from hami.errors import AnnotationError
from hami.model import ContainerDevice

log = logging.getLogger("device_plugin.allocator")

#: Directory of the records under ``<hook>/vgpu`` (never mounted into a container).
SERVED_DIR = "served"
_UID = re.compile(r"[A-Za-z0-9-]{1,64}")
MAX_RECORD_BYTES = 65536


@dataclass
class ServedContainer:
    """One served container: its name, the cards and limits it got, the boot it was (last) served in."""

    name: str
    devices: list[ContainerDevice]
    boot_id: str


@dataclass
class ServedPod:
    """What was served to the containers (by device-list index) of the pod `uid`."""

    uid: str
    namespace: str
    name: str
    containers: dict[int, ServedContainer] = field(default_factory=dict)

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"


class ServedRecords:
    """The records in `directory` (created 0700 on first write)."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)

    def _path(self, uid: str) -> Path:
        if not _UID.fullmatch(uid):
            raise ValueError(f"pod UID {uid!r} is not usable as a file name")
        return self.directory / f"{uid}.json"

    def load(self, uid: str) -> ServedPod | None:
        """The record of pod `uid`, None when there is none or it cannot be read."""
        try:
            path = self._path(uid)
            if path.stat().st_size > MAX_RECORD_BYTES:
                raise ValueError(f"larger than {MAX_RECORD_BYTES} bytes")
            raw = json.loads(path.read_text())
            return _decode(raw, uid)
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError, AnnotationError) as e:
            log.warning("served record of pod %s skipped: %s", uid, e)
            return None

    def all(self) -> list[ServedPod]:
        """Every readable record, by pod UID."""
        try:
            names = sorted(p.stem for p in self.directory.glob("*.json"))
        except OSError:
            return []
        return [r for r in (self.load(u) for u in names if _UID.fullmatch(u)) if r is not None]

    def save(self, record: ServedPod) -> None:
        """Write `record` whole (atomically). Raises OSError."""
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        path = self._path(record.uid)
        body = {
            "uid": record.uid,
            "namespace": record.namespace,
            "name": record.name,
            "containers": {
                str(i): {
                    "name": c.name,
                    "devices": ann.encode_container_devices(c.devices),
                    "boot_id": c.boot_id,
                }
                for i, c in sorted(record.containers.items())
            },
        }
        tmp = path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(body, f, separators=(",", ":"))
        os.replace(tmp, path)

    def record(
        self,
        uid: str,
        namespace: str,
        name: str,
        served: Iterable[tuple[int, str, list[ContainerDevice]]],
        boot_id: str,
    ) -> None:
        """Add the containers `served` ((index, name, devices)) of pod `uid` in boot `boot_id`."""
        rec = self.load(uid) or ServedPod(uid, namespace, name)
        for idx, cname, devices in served:
            rec.containers[idx] = ServedContainer(cname, list(devices), boot_id)
        self.save(rec)

    def prune(self, live_uids: set[str]) -> int:
        """Remove the records of pods not in `live_uids`; returns how many were removed."""
        removed = 0
        for rec in self.all():
            if rec.uid not in live_uids:
                try:
                    self._path(rec.uid).unlink()
                    removed += 1
                except OSError as e:
                    log.warning("served record of pod %s not removed: %s", rec.uid, e)
        return removed


def _decode(raw: object, uid: str) -> ServedPod:
    if not isinstance(raw, dict) or raw.get("uid") != uid or not isinstance(raw.get("containers"), dict):
        raise ValueError("not a served record of this pod")
    rec = ServedPod(uid, str(raw.get("namespace", "")), str(raw.get("name", "")))
    for key, c in raw["containers"].items():
        if not isinstance(c, dict):
            raise ValueError(f"container {key!r} is not an object")
        rec.containers[int(key)] = ServedContainer(
            str(c.get("name", "")), ann.decode_container_devices(str(c["devices"])), str(c.get("boot_id", ""))
        )
    return rec
