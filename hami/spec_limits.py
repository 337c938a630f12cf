"""What a container's spec asks on a card: the floor the scheduler counts and the ceiling the device
plugin serves, whatever the pod's allocation annotations say.

A pod's owner writes its spec and, where nothing stops it, can rewrite its allocation annotations
later. The spec's device requests cannot change after creation and are what the scheduler fitted, so
they bound what the annotations may claim: a restarted extender never counts a card for less than
the spec asks there (`at_least_the_spec`), and the device plugin never serves more (`asked_on`).
Only vendors with the generic per-card fit are bounded here; a vendor with its own fit
(`Vendor.custom_fit`: MIG slices, whole boards) allocates by its own rules.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import replace

from hami.model import ContainerDevice, ContainerRequest, Device, PodDevices
from hami.pods import ContainerSpec
from hami.vendors.base import Vendor

log = logging.getLogger("hami.cluster")


def asked_on(req: ContainerRequest, card: Device) -> tuple[int, int]:
    """(MiB, SM percent) that `req` takes on `card`: the memory request (MiB, or percent of the card's
    registered memory, or the whole card) and the cores request (percent; 100 for a container that
    turns enforcement off)."""
    return req.memory_on(card), req.coresreq


def at_least_the_spec(
    devices: PodDevices,
    specs: Sequence[ContainerSpec],
    cards: Mapping[str, Device],
    vendors: Mapping[str, Vendor],
    *,
    ref: str = "",
) -> PodDevices:
    """`devices` (per vendor, one list per container in device-list order) with every card of a
    generic-fit vendor raised to what the container's spec asks on it (`asked_on`).

    `specs`: the pod's requests per container (`hami.pods.requests`); `cards`: the node's registered
    cards by UUID. Cards not in `cards`, containers without a request of that vendor and vendors with
    their own fit are left as written. A raised card is logged (at debug level) with `ref` (the pod) and both figures.
    """
    out: PodDevices = {}
    for vendor, lists in devices.items():
        v = vendors.get(vendor)
        if v is None or v.custom_fit:
            out[vendor] = lists
            continue
        raised: list[list[ContainerDevice]] = []
        for i, entry in enumerate(lists):
            asked = specs[i].requests if i < len(specs) else ()
            req = next((r for r in asked if r.vendor == vendor), None)
            fixed = []
            for d in entry:
                card = cards.get(d.uuid)
                if req is not None and card is not None:
                    mem, cores = asked_on(req, card)
                    if mem > d.usedmem or cores > d.usedcores:
                        # Debug only: every relist would repeat it, and the simulator and tools print logs.
                        log.debug(
                            "pod %s container %d: allocation on %s says %d MiB / %d %%, its spec asks %d MiB / "
                            "%d %%; counting at least the spec",
                            ref, i, d.uuid, d.usedmem, d.usedcores, mem, cores,
                        )  # fmt: skip
                        d = replace(d, usedmem=max(mem, d.usedmem), usedcores=max(cores, d.usedcores))
                fixed.append(d)
            raised.append(fixed)
        out[vendor] = raised
    return out
