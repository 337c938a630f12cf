"""What the webhook needs from each vendor and from the cluster cache, as small Protocols.

The webhook only orchestrates (ARCHITECTURE.md): per container it asks every vendor whether the
container uses that vendor's devices and lets the vendor fill in its defaults; the vendor-specific
rules live in `hami/vendors/`. This module names exactly the surface the orchestrator calls, so the
vendor registry of `hami.vendors` is adapted to it in one place (`webhook.vendors`) and tests can
drive the orchestrator with any object of this shape.

The two cluster views are read-only caches filled by watches in the CLI; the webhook never calls the
API server while answering a review (the API server is waiting on us, with a timeout of a few seconds).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol


class VendorHook(Protocol):
    """One vendor, as seen by the webhook.

    - `name`: the vendor's CommonWord (``NVIDIA``), for messages.
    - `resource_names`: every resource name the vendor manages (count, memory, cores, priority ...).
    - `allocation_annotation_keys`: pod annotations only HAMi may write (to-allocate, allocated ...).
    - `pod_annotation_keys`: annotations users may set to steer selection (``nvidia.com/use-gputype``).
    - `annotation_prefixes`: key prefixes owned by the vendor (``nvidia.com/``): an unknown key with one
      of these prefixes is reported as a likely typo.
    """

    name: str
    resource_names: frozenset[str]
    allocation_annotation_keys: tuple[str, ...]
    pod_annotation_keys: tuple[str, ...]
    annotation_prefixes: tuple[str, ...]

    def mutate_container(self, container: dict[str, Any], *, pod: dict[str, Any]) -> bool:
        """Apply the vendor's admission rules to `container` (and `pod`, e.g. runtimeClassName) in place.

        Returns True when the container asks for this vendor's devices. Raises `InvalidRequest` whose
        message names the resource and the valid values; the caller adds which container it was.
        """
        ...

    def quota_request(self, container: Mapping[str, Any]) -> dict[str, int]:
        """What the (already mutated) container counts against namespace quotas, per quota resource.

        Keys are resource names as they appear after `limits.` in a ResourceQuota (e.g.
        ``nvidia.com/gpumem``: MiB over all its cards, ``nvidia.com/gpucores``: percent over all its
        cards). Percentage-only memory requests count as 0 (resolved per card by the scheduler).
        """
        ...


@dataclass(frozen=True)
class QuotaLine:
    """One tracked quota resource of a namespace: `used` and `limit` in the request's unit (MiB/percent)."""

    used: int
    limit: int


class QuotaView(Protocol):
    """A cached view of namespace device quotas (fed by watches; no API call per review)."""

    def used_and_limits(self, namespace: str) -> Mapping[str, QuotaLine]:
        """Resource name (``nvidia.com/gpumem``) -> QuotaLine, only for resources with a limit set."""
        ...


class NamespaceView(Protocol):
    """A cached view of namespace labels, to honour `hami.io/webhook: ignore` on namespaces."""

    def labels(self, namespace: str) -> Mapping[str, str] | None:
        """The namespace's labels, or None when it is not (yet) in the cache."""
        ...
