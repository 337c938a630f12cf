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
- admission: the webhook's per-container mutation and validation.
Vendors never do I/O: they take and return plain dicts in the API's JSON form.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from hami.model import ContainerDevice, ContainerRequest, Device, Selection


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

    def allocation_annotations(self, containers: Sequence[Sequence[ContainerDevice]]) -> dict[str, str]:
        """Pod annotations the scheduler writes at filter time for this allocation (one entry per container)."""
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


def split_list(value: str | None) -> tuple[str, ...]:
    """A comma list from an annotation, trimmed, empties dropped (HAMi: empty value = no constraint)."""
    if not value:
        return ()
    return tuple(p.strip() for p in value.split(",") if p.strip())
