"""`hami inspect`: what is on each node and card, as report objects built from a `Snapshot`.

Everything shown is what the scheduler extender counts: usage comes from the `ClusterState` rebuilt from
the pods' allocation annotations (`hami.io/vgpu-devices-allocated` and the vendors' keys), so a pod the
extender would not count (another scheduler's, a finished one) is not on any card here either. The
per-container split is read from the same annotations (one entry per container, init containers first).

Units: memory MiB, cores percent of one card (100 = the whole card), percentages of the card's or
node's registered memory rounded to one decimal. Pure: no I/O, the clock is the snapshot's.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from hami import annotations as A
from hami import objects, pods
from hami.card_checks import check_card
from hami.cluster import CardStat
from hami.errors import AnnotationError, InvalidRequest
from hami.model import MIG_MODE, ContainerRequest, Device, DeviceUsage, Selection
from hami.nodelock import lock_age_s, read_node_lock
from hami.tools.snapshot import Snapshot, pending_device_pods, unschedulable
from hami.vendors.nvidia_mig import free_placement, mig_text


def percent(part: int, whole: int) -> float:
    """`part` of `whole` in percent, one decimal; 0 when `whole` is 0."""
    return round(100.0 * part / whole, 1) if whole else 0.0


@dataclass(slots=True)
class ContainerOnCard:
    """One container's share of one card: `memory` MiB (`memory_percent` of the card), `cores` percent.

    `used` MiB and `utilization` percent come from the node monitor (`--usage`), None when not joined.
    """

    namespace: str
    pod: str
    container: str
    memory: int
    memory_percent: float
    cores: int
    used: int | None = None
    utilization: float | None = None
    mig: str | None = None  # the container's MIG instance on the card ("MIG 2g.10gb at slices 0-1")

    @property
    def idle(self) -> bool | None:
        """Allocated but idle: the monitor saw no memory in use and no utilisation; None without figures."""
        if self.used is None:
            return None
        return self.used == 0 and not self.utilization


@dataclass(slots=True)
class CardReport:
    uuid: str
    index: int
    vendor: str
    model: str
    numa: int
    health: bool
    cordoned: bool
    slots_used: int
    slots: int
    memory_allocated: int
    memory: int
    cores_allocated: int
    cores: int
    containers: list[ContainerOnCard] = field(default_factory=list)
    mode: str = "hami-core"
    #: MIG mode: the profiles the card offers that still have a free placement (a new instance fits).
    mig_free: list[str] = field(default_factory=list)

    @property
    def memory_percent(self) -> float:
        return percent(self.memory_allocated, self.memory)

    @property
    def usable(self) -> bool:
        return self.health and not self.cordoned


@dataclass(slots=True)
class LockReport:
    """The node lock (`hami.io/mutex.lock`): `holder` ``ns/pod`` (None for an owner-less legacy lock);
    `expired` when older than the extender's lock timeout (the next bind takes it over, nobody waits)."""

    holder: str | None
    since: str
    age_s: float
    expired: bool = False


@dataclass(slots=True)
class NodeReport:
    name: str
    vendors: list[str]
    models: list[str]
    cards: list[CardReport]
    cordoned: bool  # spec.unschedulable
    problem: str | None  # why the extender places nothing here (registration, handshake), None = usable
    handshake: dict[str, str]  # handshake annotation -> value
    lock: LockReport | None
    lock_problem: str | None = None  # a lock value that does not parse

    @property
    def slots_used(self) -> int:
        return sum(c.slots_used for c in self.cards)

    @property
    def slots(self) -> int:
        return sum(c.slots for c in self.cards)

    @property
    def memory_allocated(self) -> int:
        return sum(c.memory_allocated for c in self.cards)

    @property
    def memory(self) -> int:
        return sum(c.memory for c in self.cards)

    @property
    def cores_allocated(self) -> int:
        return sum(c.cores_allocated for c in self.cards)

    @property
    def cores(self) -> int:
        return sum(c.cores for c in self.cards)


@dataclass(slots=True)
class ModelReport:
    """The cluster footer for one card model: `free` cards nobody holds (usable ones), `fragmented`
    cards with free memory on which no single pending pod's container fits (0 when nothing is pending).
    Cards of cordoned or unusable nodes are never free."""

    vendor: str
    model: str
    cards: int
    memory_allocated: int
    memory: int
    free: int
    fragmented: int


@dataclass(slots=True)
class QuotaReport:
    namespace: str
    resource: str
    used: int
    limit: int


@dataclass(slots=True)
class ClusterReport:
    """`hami inspect`'s answer: `nodes` (those named, else all), the per-model footer and the quotas."""

    generated: str  # RFC 3339, UTC
    nodes: list[NodeReport]
    models: list[ModelReport]
    quotas: list[QuotaReport]
    pending: int  # pending device pods the fragmentation count was judged against
    usage_joined: bool = False


def _containers_on_cards(snapshot: Snapshot) -> dict[str, list[ContainerOnCard]]:
    """card uuid -> the containers holding it, from the counted pods' allocation annotations."""
    counted = {(ns, name) for ns, name, _, _ in snapshot.state.pod_grants()}
    card_mem = {d.uuid: d.devmem for byv in snapshot.devices.values() for ds in byv.values() for d in ds}
    out: dict[str, list[ContainerOnCard]] = defaultdict(list)
    for p in snapshot.listed.pods:
        ns, name = objects.namespace(p), objects.name(p)
        if (ns, name) not in counted:
            continue
        annos = objects.annotations(p)
        names = pods.container_names(p)
        kinds = pods.container_kinds(p)
        for vendor in snapshot.state.vendors.values():
            try:
                lists = vendor.pod_devices(annos, len(kinds))
            except AnnotationError:
                continue  # the state did not count it either
            if lists is None:
                continue
            if pods.init_done(p):
                lists = pods.without_finished_init({vendor.common_word: lists}, kinds)[vendor.common_word]
            for i, cds in enumerate(lists):
                container = names[i] if i < len(names) else f"#{i}"
                for cd in cds:
                    out[cd.uuid].append(
                        ContainerOnCard(ns, name, container, cd.usedmem, percent(cd.usedmem, card_mem.get(cd.uuid, 0)),
                                        cd.usedcores, mig=mig_text(cd.mig) if cd.mig else None)
                    )  # fmt: skip
    for lst in out.values():
        lst.sort(key=lambda c: (c.namespace, c.pod, c.container))
    return out


def node_report(
    snapshot: Snapshot,
    name: str,
    on_cards: dict[str, list[ContainerOnCard]],
    stats: Mapping[tuple[str, str], CardStat],
) -> NodeReport:
    """One node's report (cards in vendor then index order); `stats`: the state's card usage by (node, UUID)."""
    node = snapshot.node(name) or {"metadata": {"name": name}}
    annos = objects.annotations(node)
    cordon = {u.strip() for u in annos.get(A.DEVICE_CORDON, "").split(",") if u.strip()}
    cards: list[CardReport] = []
    for vendor, devices in sorted(snapshot.devices.get(name, {}).items()):
        for d in devices:
            s = stats.get((name, d.uuid))
            cards.append(
                CardReport(
                    d.uuid,
                    d.index,
                    vendor,
                    d.type,
                    d.numa,
                    d.health,
                    d.uuid in cordon,
                    s.used if s else 0,
                    d.count,
                    s.usedmem if s else 0,
                    d.devmem,
                    s.usedcores if s else 0,
                    d.devcore,
                    on_cards.get(d.uuid, []),
                    d.mode,
                    mig_free(d, s),
                )  # fmt: skip
            )
    lock = lock_problem = None
    try:
        nl = read_node_lock(node)
    except AnnotationError as e:
        nl, lock_problem = None, f"{A.NODE_LOCK}: {e}"
    if nl is not None:
        holder = f"{nl.namespace}/{nl.name}" if nl.namespace and nl.name else None
        held = lock_age_s(nl, now=snapshot.now)
        lock = LockReport(holder, A.format_rfc3339(nl.time), round(held, 1), held > snapshot.lock_timeout_s)
    shakes = {
        v.handshake_key: annos[v.handshake_key]
        for v in snapshot.state.vendors.values()
        if v.handshake_key and v.handshake_key in annos
    }
    return NodeReport(
        name=name,
        vendors=sorted({c.vendor for c in cards}),
        models=sorted({c.model for c in cards}),
        cards=cards,
        cordoned=unschedulable(node),
        problem=snapshot.state.node_unusable_reason(name),
        handshake=dict(sorted(shakes.items())),
        lock=lock,
        lock_problem=lock_problem,
    )


def mig_free(card: Device, stat: CardStat | None) -> list[str]:
    """A MIG card's profiles that have a free placement now (none when its occupancy is unknown)."""
    if card.mode != MIG_MODE or (stat is not None and stat.mig_unknown):
        return []
    taken = stat.mig if stat is not None else ()
    return [p.name for p in card.mig_profiles if free_placement(p, taken) is not None]


def _pending_requests(snapshot: Snapshot) -> list[tuple[ContainerRequest, Selection]]:
    """Every distinct (request, selection) of the pending device pods."""
    seen: dict[tuple[ContainerRequest, Selection], None] = {}
    for p in pending_device_pods(snapshot):
        annos = objects.annotations(p)
        try:
            for c in snapshot.state.pod_requests(p):
                for r in c.requests:
                    seen[(r, snapshot.state.vendors[r.vendor].selection(annos))] = None
        except InvalidRequest:
            continue
    return list(seen)


def fragmented(card: Device, usage: DeviceUsage, cordoned: frozenset[str], wanted: Sequence[tuple[ContainerRequest, Selection]],
               snapshot: Snapshot) -> bool:  # fmt: skip
    """A usable card with free memory on which none of the `wanted` container requests fits alone
    (the fit's own per-card checks, `hami.card_checks.check_card`). False when nothing is wanted."""
    if not wanted or not card.health or card.uuid in cordoned or card.devmem - usage.usedmem <= 0:
        return False
    for req, sel in wanted:
        if req.vendor != card.vendor:
            continue
        vendor = snapshot.state.vendors[req.vendor]
        mem = req.memory_on(card)
        reason = check_card(card, usage, req, mem, sel, vendor, mutex=False, cordoned=cordoned, quota_ok=None)
        if reason is None and vendor.card_rule(card, usage, req, mem, sel, ()) is None:
            return False
    return True


def model_footer(snapshot: Snapshot, reports: Iterable[NodeReport]) -> tuple[list[ModelReport], int]:
    """Per (vendor, model): cards, allocated memory, free and fragmented cards; and the pending count."""
    wanted = _pending_requests(snapshot)
    devices = {d.uuid: d for byv in snapshot.devices.values() for ds in byv.values() for d in ds}
    stats = {(s.node, s.uuid): s for s in snapshot.state.card_stats()}
    rows: dict[tuple[str, str], ModelReport] = {}
    for nr in reports:
        cordoned = frozenset(c.uuid for c in nr.cards if c.cordoned)
        for c in nr.cards:
            m = rows.setdefault((c.vendor, c.model), ModelReport(c.vendor, c.model, 0, 0, 0, 0, 0))
            m.cards += 1
            m.memory += c.memory
            m.memory_allocated += c.memory_allocated
            if c.usable and nr.problem is None and not nr.cordoned and c.slots_used == 0:
                m.free += 1
            dev = devices.get(c.uuid) or Device(
                c.uuid, c.index, c.slots, c.memory, c.cores, c.model, c.numa, health=c.health, vendor=c.vendor
            )
            s = stats.get((nr.name, c.uuid))
            use = DeviceUsage(c.slots_used, c.memory_allocated, c.cores_allocated, s.mig if s else (),
                              s.mig_unknown if s else 0)  # fmt: skip
            if c.slots_used and nr.problem is None and fragmented(dev, use, cordoned, wanted, snapshot):
                m.fragmented += 1
    return [rows[k] for k in sorted(rows)], sum(1 for _ in pending_device_pods(snapshot))


def inspect_cluster(snapshot: Snapshot, names: Sequence[str] = ()) -> ClusterReport:
    """The report for the nodes `names` (all nodes when empty, in name order).

    Raises `hami.errors.NotFound` naming the first node that is not in the snapshot. The per-model footer
    and the quotas cover the nodes reported.
    """
    from hami.errors import NotFound

    known = snapshot.node_names()
    for n in names:
        if n not in known:
            raise NotFound(f"node {n!r} not found")
    on_cards = _containers_on_cards(snapshot)
    stats = {(s.node, s.uuid): s for s in snapshot.state.card_stats()}
    reports = [node_report(snapshot, n, on_cards, stats) for n in (list(dict.fromkeys(names)) or known)]
    models, pending = model_footer(snapshot, reports)
    quotas = [QuotaReport(*q) for q in snapshot.state.quota_stats()]
    return ClusterReport(A.format_rfc3339(snapshot.now), reports, models, quotas, pending)
