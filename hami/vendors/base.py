"""The one interface every accelerator vendor implements (HAMi's `Devices`, hami-legacy-spec §6.1).

Designed against the whole vendor table (§6.2), so that adding Cambricon, Iluvatar, MetaX, Ascend, ...
is one module plus one registry line:
- requests: each vendor reads its own resource names from a container (with its own units: MiB,
  256 MiB, GiB, templates) and returns a `ContainerRequest`, or None when the container asks nothing;
- registration: where its cards come from (JSON annotation, colon annotation, node capacity);
- selection rules: its use/nouse annotations, and whether a card type matches them;
- allocation annotations: the keys the scheduler writes at filter time and the device plugin consumes,
  plus extra vendor keys (`CAMBRICON_DSMLU_PROFILE`, `BAIDU_COM_DEVICE_IDX`, ...);
- locking: whether bind takes `hami.io/mutex.lock` (or its own lock key);
- admission: the webhook's per-container mutation and validation;
- per-card rules inside the generic fit (HAMi's CustomFilterRule and AddResourceUsage): a card that
  one container may take several times (`card_repeats`: NVIDIA MIG instances), an extra check after
  the generic ones (`card_rule`), and the final form of the devices taken on a card (`finish_card`:
  a MIG profile's memory and cores, its placement); and how a pod's allocation annotations read back
  into device lists (`pod_devices`);
- vendor rules the generic fit cannot express (`custom_fit`): capacity-derived inventories
  (`node_capacity_keys`), pod-wide "same card" rules (`fit_cards` sees the devices of the pod's earlier
  containers), topology choices, and extra pod annotations written at filter time
  (`allocation_annotations` gets an `AllocationContext` with the node, the pod and the clock).
Vendors never do I/O: they take and return plain dicts in the API's JSON form. `VendorBase` holds the
defaults of the optional members, so a vendor states only what differs.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from hami import annotations as A
from hami import objects
from hami.errors import InvalidRequest
from hami.model import ContainerDevice, ContainerRequest, Device, DeviceUsage, Selection

if TYPE_CHECKING:
    from hami.reason_words import Reason
    from hami.scoring import PolicyChoice


@dataclass(frozen=True, slots=True)
class ResourceNames:
    """A vendor's extended resource names (None where the vendor has no such resource).

    `memory_factor` multiplies memory requests (HAMi `memoryFactor`), also when checking quotas.
    """

    count: str
    memory: str | None = None
    memory_percentage: str | None = None
    cores: str | None = None
    priority: str | None = None
    memory_factor: int = 1

    def all(self) -> tuple[str, ...]:
        return tuple(
            n for n in (self.count, self.memory, self.memory_percentage, self.cores, self.priority) if n
        )


@dataclass(slots=True)
class MutationResult:
    """What the webhook learns from one container: does it use this vendor's device, and any warnings."""

    uses_device: bool = False
    warnings: list[str] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class AllocationContext:
    """What a vendor may need besides the device lists to write its filter-time pod annotations.

    `node`: the chosen node; `pod`: the pod in API JSON form; `cards`: this vendor's cards on the node by
    UUID (for card indexes); `container_names`: in device-list order (init containers first); `now`: Unix
    seconds (nanosecond stamps are derived from it, so a test can fix the clock).
    """

    node: str
    pod: Mapping[str, Any] = field(default_factory=dict)
    cards: Mapping[str, Device] = field(default_factory=dict)
    container_names: Sequence[str] = ()
    now: float = 0.0


#: usage(uuid) -> the card's usage as the fit sees it (node usage plus earlier containers of the pod).
UsageOf = Callable[[str], DeviceUsage]


@runtime_checkable
class Vendor(Protocol):
    """One accelerator vendor. Attributes are constants of the vendor; methods are pure."""

    #: HAMi's CommonWord: the request type written in pod device lists (`NVIDIA`, `DCU`, `MLU`, ...).
    common_word: str
    #: Node annotation with the registration, and the handshake key (None when the vendor has none).
    register_key: str
    handshake_key: str | None
    #: Pod annotations with the device list: consumed by the device plugin / kept for accounting.
    to_allocate_key: str | None
    allocated_key: str
    #: Whether bind takes the shared `hami.io/mutex.lock` for pods using this vendor.
    uses_node_lock: bool
    #: The allocation annotations the node lock's stamp digests (`hami.annotations.AllocationStamp`):
    #: what the device plugin serves from and never changes, or changes only by adding fields the
    #: digest leaves out (NVIDIA's MIG reservations get their runtime identity at Allocate).
    stamped_keys: tuple[str, ...]
    #: Node annotations, `status.capacity` entries and labels the inventory reads: a node event that
    #: changes none of them (lock or handshake writes) does not re-parse the node.
    node_annotation_keys: tuple[str, ...]
    node_capacity_keys: tuple[str, ...]
    node_label_keys: tuple[str, ...]
    #: True when `fit_cards` replaces the generic per-card fit (`hami.fit.fit_container`), and the
    #: filter's card-summary prefilter must leave this vendor's demands to it.
    custom_fit: bool
    #: True when `node_score` adds a topology term to a node's score (the filter then fits every
    #: candidate node of a pod asking this vendor and keeps the best total).
    scores_nodes: bool

    def resource_names(self) -> ResourceNames:
        """The extended resources this vendor reads from containers."""
        ...

    def user_annotation_keys(self) -> tuple[str, ...]:
        """Pod annotations users may set for this vendor (selection rules), for typo warnings."""
        ...

    def allocation_keys(self) -> tuple[str, ...]:
        """Pod annotations only the scheduler or device plugin may write (stripped from user pods)."""
        ...

    def container_request(self, container: Mapping[str, Any]) -> ContainerRequest | None:
        """The container's request (per card), or None when it asks for none of these devices.

        Raises InvalidRequest naming the container and resource for quantities that cannot work.
        """
        ...

    def selection(self, annotations: Mapping[str, str]) -> Selection:
        """The pod's selection rules for this vendor from its annotations. Raises InvalidRequest."""
        ...

    def type_matches(self, device: Device, selection: Selection) -> bool:
        """Type and mode rules of `selection` against one card (HAMi checkType)."""
        ...

    def node_devices(self, node: Mapping[str, Any]) -> list[Device] | None:
        """Cards registered on `node`; None when the node carries no registration for this vendor.

        Raises AnnotationError for a malformed registration.
        """
        ...

    def allocation_annotations(
        self, containers: Sequence[Sequence[ContainerDevice]], *, context: AllocationContext | None = None
    ) -> dict[str, str]:
        """Pod annotations the scheduler writes at filter time for this allocation (one entry per container)."""
        ...

    def pod_devices(
        self, annotations: Mapping[str, str], containers: int
    ) -> list[list[ContainerDevice]] | None:
        """This vendor's devices of a pod, one list per container (init first), read back from the
        annotations `allocation_annotations` wrote; None when the pod has none of this vendor.

        Raises AnnotationError for a malformed device list.
        """
        ...

    def card_repeats(self, device: Device, selection: Selection) -> bool:
        """Whether one container may take several devices on this one card (each a MIG instance); the
        generic fit then also skips its "fewer cards than asked" rule for a node with such a card."""
        ...

    def card_rule(
        self,
        device: Device,
        usage: DeviceUsage,
        req: ContainerRequest,
        mem: int,
        selection: Selection,
        taken: Sequence[ContainerDevice],
    ) -> str | None:
        """The vendor's check after the generic per-card checks (HAMi's CustomFilterRule): None when
        the card can take one more device of `mem` MiB after `taken` (this container's devices already
        on the card), else the reason word (``CardMigTopologyInfeasible``)."""
        ...

    def finish_card(
        self, device: Device, usage: DeviceUsage, devices: Sequence[ContainerDevice], selection: Selection
    ) -> list[ContainerDevice]:
        """The devices one container takes on one card, in their final form (HAMi's AddResourceUsage:
        on a MIG card each becomes its profile's memory and cores at a free placement)."""
        ...

    def fit_cards(
        self,
        req: ContainerRequest,
        cards: Sequence[Device],
        usage: UsageOf,
        *,
        selection: Selection,
        policy: PolicyChoice,
        earlier: Sequence[Sequence[ContainerDevice]],
        quota_ok: Callable[[int, int], bool] | None,
    ) -> tuple[list[ContainerDevice] | None, Counter[Reason]]:
        """Only with `custom_fit`: choose cards for one container request, or return per-card reasons.

        `earlier`: this vendor's devices of the pod's earlier containers of the same phase (init
        containers see earlier init containers, app containers earlier app containers).
        """
        ...

    def node_score(
        self,
        containers: Sequence[Sequence[ContainerDevice]],
        *,
        cards: Mapping[str, Device],
        node_policy: str,
    ) -> float:
        """Only with `scores_nodes`: the vendor's term for placing these device lists (one per container)
        on the node whose cards (by UUID) are `cards`, under node policy `binpack` or `spread`. Higher is
        better under both policies (HAMi's ScoreNode); the node's usage score is 0..30."""
        ...

    def mutate_container(self, container: dict[str, Any], *, pod: dict[str, Any]) -> MutationResult:
        """Webhook: validate and normalise one container in place (limits, env; pod-level fields such as
        runtimeClassName may be set on `pod`). Raises InvalidRequest naming container, field, valid values.
        """
        ...


def container_limits(container: Mapping[str, Any]) -> dict[str, Any]:
    """`resources.limits` of a container, then `resources.requests` for names absent from limits
    (HAMi reads limits first, then requests)."""
    res = container.get("resources") or {}
    merged = dict(res.get("requests") or {})
    merged.update(res.get("limits") or {})
    return merged


def set_env(container: dict[str, Any], name: str, value: str) -> None:
    """Set env `name` on a container (replacing an existing plain value)."""
    env = container.setdefault("env", [])
    for e in env:
        if e.get("name") == name:
            e.pop("valueFrom", None)
            e["value"] = value
            return
    env.append({"name": name, "value": value})


#: Entries a selection list (use/nouse card types or UUIDs) may hold. Each is checked against every
#: card of every candidate node under the scheduler's lock, so the list's length is every other pod's
#: wait; a pod owner writes it (and may change it after creation).
MAX_SELECTION_ENTRIES = 64


def split_list(value: str | None, *, field: str = "") -> tuple[str, ...]:
    """A comma list from an annotation, trimmed, empties dropped (HAMi: empty value = no constraint).

    Raises InvalidRequest naming `field` (the annotation key) when it holds more than
    `MAX_SELECTION_ENTRIES` entries.
    """
    if not value:
        return ()
    out = tuple(p.strip() for p in value.split(",") if p.strip())
    if len(out) > MAX_SELECTION_ENTRIES:
        raise InvalidRequest(
            f"annotation {field or 'list'} has {len(out)} entries; at most {MAX_SELECTION_ENTRIES} "
            "comma-separated card types or UUIDs are read"
        )
    return out


class VendorBase:
    """Defaults of the optional vendor members; concrete vendors subclass it and override."""

    common_word = ""
    register_key = ""
    handshake_key: str | None = None
    to_allocate_key: str | None = None
    allocated_key = ""
    uses_node_lock = False
    node_capacity_keys: tuple[str, ...] = ()
    node_label_keys: tuple[str, ...] = ()
    custom_fit = False
    scores_nodes = False

    @property
    def node_annotation_keys(self) -> tuple[str, ...]:
        return (self.register_key,) if self.register_key else ()

    def user_annotation_keys(self) -> tuple[str, ...]:
        return ()

    def allocation_keys(self) -> tuple[str, ...]:
        return tuple(k for k in (self.to_allocate_key, self.allocated_key) if k)

    @property
    def stamped_keys(self) -> tuple[str, ...]:
        return (self.allocated_key,) if self.allocated_key else ()

    def selection(self, annotations: Mapping[str, str]) -> Selection:
        return Selection()

    def type_matches(self, device: Device, selection: Selection) -> bool:
        return True

    def fit_cards(self, req, cards, usage, *, selection, policy, earlier, quota_ok):  # noqa: ANN001, ANN201
        raise NotImplementedError(f"{type(self).__name__} has no custom fit")

    def pod_devices(
        self, annotations: Mapping[str, str], containers: int
    ) -> list[list[ContainerDevice]] | None:
        value = annotations.get(self.allocated_key)
        if value is None:
            return None
        # Lists written by other HAMi versions may lack leading empty entries (§8.2).
        return A.align_pod_devices(A.decode_pod_devices(value), containers)

    def card_repeats(self, device: Device, selection: Selection) -> bool:
        return False

    def card_rule(self, device, usage, req, mem, selection, taken):  # noqa: ANN001, ANN201
        return None

    def finish_card(self, device, usage, devices, selection):  # noqa: ANN001, ANN201
        return list(devices)

    def node_score(self, containers, *, cards, node_policy):  # noqa: ANN001, ANN201
        return 0.0


def group_score(
    containers: Sequence[Sequence[ContainerDevice]], group_of: Callable[[str], Any]
) -> float | None:
    """Sum over containers with cards of (most cards in one group / cards), the "kept together" term of
    HAMi's Ascend NetworkID and Vastai die scores; None when a card has no group."""
    total = 0.0
    for c in containers:
        if not c:
            continue
        counts: dict[Any, int] = {}
        for cd in c:
            g = group_of(cd.uuid)
            if g is None:
                return None
            counts[g] = counts.get(g, 0) + 1
        total += max(counts.values()) / len(c)
    return total


def registered(
    node: Mapping[str, Any], key: str, decode: Callable[[str], list[Device]]
) -> list[Device] | None:
    """A node's inventory from its registration annotation `key`, read by `decode`; None when the node
    has no such annotation (the vendor is not on that node). Raises what `decode` raises
    (AnnotationError for a value it cannot read)."""
    value = A.pod_annotations(node).get(key)
    return None if value is None else decode(value)


def capacity(node: Mapping[str, Any], resource: str) -> Any:
    """`status.capacity[resource]` of a node (None when absent or when a member is not a mapping)."""
    cap = objects.status(node).get("capacity")
    return cap.get(resource) if isinstance(cap, dict) else None


def labels(obj: Mapping[str, Any]) -> Mapping[str, str]:
    """`metadata.labels` of an object (empty when absent)."""
    return objects.labels(obj)
