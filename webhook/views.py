"""What the webhook reads from the cluster while reviewing: cached views, as small Protocols.

The webhook only orchestrates (ARCHITECTURE.md): per container it calls every vendor's admission hook
(`hami.vendors.base.Vendor.mutate_container`); the vendor-specific rules live in `hami/vendors/`.
What it needs from the cluster are two read-only caches, named here as Protocols so that the CLI can
feed them from watches and tests from plain dicts: the webhook never calls the API server while
answering a review (the API server is waiting on us, within a timeout of a few seconds).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol


class QuotaView(Protocol):
    """A cached view of namespace device quotas (`hami.quota.QuotaState` fed by a ResourceQuota watch)."""

    def exceeds_alone(self, namespace: str, demand: Mapping[str, tuple[int, int]]) -> str | None:
        """Whether the pod alone (`demand`: vendor CommonWord -> (MiB, percent)) exceeds a limit of the
        namespace: a message naming the quota resource, the demand and the limit, or None."""
        ...


class NamespaceView(Protocol):
    """A cached view of namespace labels, to honour `hami.io/webhook: ignore` on namespaces."""

    def labels(self, namespace: str) -> Mapping[str, str] | None:
        """The namespace's labels, or None when it is not (yet) in the cache."""
        ...
