"""The per-card checks of HAMi's fit (hami-legacy-spec §2.5), in HAMi's order, each failure a `Reason`.

One module for the generic fit (`hami.fit`), the vendors' own fits (`hami.vendors.common`), the
filter's prefilter (`hami.prefilter`) and the fragmentation measure (`hami.fragmentation_measure`,
which counts a card's free cores as the fit does), so the rule is written once. It asks of a vendor
only its type rule (`TypeRule`), so the vendor modules, which use these checks, lie above it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from hami.model import ContainerRequest, Device, DeviceUsage, Selection
from hami.reason_words import Reason


class TypeRule(Protocol):
    """What the per-card checks ask of a vendor (`hami.vendors.base.Vendor`): whether a card's type
    passes the pod's selection (use/nouse types, mode, MIG profile)."""

    def type_matches(self, device: Device, selection: Selection) -> bool: ...


def check_card(
    d: Device,
    u: DeviceUsage,
    req: ContainerRequest,
    mem: int,
    sel: Selection,
    vendor: TypeRule,
    *,
    mutex: bool,
    cordoned: frozenset[str],
    quota_ok: Callable[[int, int], bool] | None,
) -> Reason | None:
    """The per-card checks of §2.5 in HAMi's order; None when the card can take the request.

    A card in MIG mode held by a pod whose instances are not on record (`DeviceUsage.mig_unknown`)
    counts as unhealthy, as in HAMi: its free placements are unknown.
    """
    if not d.health or u.mig_unknown:
        return Reason.CARD_NOT_HEALTH
    if d.uuid in cordoned:
        return Reason.CARD_CORDONED
    if (sel.use_types or sel.nouse_types or sel.mode or sel.mig_profile) and not vendor.type_matches(d, sel):
        return Reason.CARD_TYPE_MISMATCH
    if (sel.use_uuids and d.uuid not in sel.use_uuids) or d.uuid in sel.nouse_uuids:
        return Reason.CARD_UUID_MISMATCH
    if d.count <= u.used:
        return Reason.CARD_TIME_SLICING_EXHAUSTED
    if mutex and u.used > 0:
        return Reason.EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT
    cores = min(req.coresreq, 100)
    if quota_ok is not None and not quota_ok(mem, cores):
        return Reason.RESOURCE_QUOTA_NOT_FIT
    if d.devmem - u.usedmem < mem:
        return Reason.CARD_INSUFFICIENT_MEMORY
    return core_reason(d.devcore, u.usedcores, u.used, cores)


def core_reason(devcore: int, usedcores: int, used: int, cores: int) -> Reason | None:
    """The core checks of §2.5 (steps 12-14), the one computation of a card's core capacity that the
    fit and the filter's prefilter (`hami.prefilter`) both use; None when the card can take `cores`.

    `devcore` is the card's registered capacity in percent (100 x deviceCoreScaling), `usedcores` the
    percent booked, `used` the slots taken, `cores` the request clamped to 100. Exclusivity (a 100 %
    request needs an idle card) applies only to a card registered with exactly 100 %: with
    deviceCoreScaling above 1 a full-card request may share the card while cores are free (HAMi's rule).
    """
    if devcore - usedcores < cores:
        return Reason.CARD_INSUFFICIENT_CORE
    if devcore == 100 and cores == 100 and used > 0:
        return Reason.EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT
    if devcore != 0 and usedcores == devcore and cores == 0:
        return Reason.CARD_COMPUTE_UNITS_EXHAUSTED
    return None
