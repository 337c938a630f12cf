"""Cached cluster views for the webhook: ResourceQuota limits and Namespace labels, kept by watches.

The API server waits on the webhook with a deadline of a few seconds shared by every mutating webhook,
so a review must never wait on the API itself. Two `hami.kube.Reflector`s (list + watch in background
threads) keep what the reviews read: `hami.quota.QuotaState` for the quota pre-check, and the labels of
namespaces for `hami.io/webhook: ignore`. Until the first list arrives the views are empty, which
admits (the scheduler checks quotas again with live usage, and the webhook configuration's
namespaceSelector already skips ignored namespaces): a slow API server delays nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from hami.kube import KubeClient, Reflector
from hami.quota import QuotaState
from hami.vendors.base import Vendor

log = logging.getLogger(__name__)


class NamespaceLabels:
    """`NamespaceView` over a Reflector of namespaces."""

    def __init__(self, reflector: Reflector) -> None:
        self.reflector = reflector

    def labels(self, namespace: str) -> Mapping[str, str] | None:
        """The namespace's labels, or None when it is not in the cache (yet)."""
        obj = self.reflector.get(namespace)
        if obj is None:
            return None
        return (obj.get("metadata") or {}).get("labels") or {}


class Caches:
    """The reflectors and the views they feed; `stop()` ends the watches."""

    def __init__(self, client: KubeClient, vendors: Mapping[str, Vendor]) -> None:
        self.client = client
        self.quota = QuotaState(vendors)
        self.quotas = Reflector(
            client,
            "resourcequotas",
            on_add=self.quota.upsert_quota,
            on_update=lambda _old, new: self.quota.upsert_quota(new),
            on_delete=self._quota_deleted,
            name="webhook-resourcequotas",
        )
        self.namespaces_reflector = Reflector(client, "namespaces", name="webhook-namespaces")
        self.namespaces = NamespaceLabels(self.namespaces_reflector)

    def _quota_deleted(self, obj: dict[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        self.quota.remove_quota(meta.get("namespace", "default"), meta.get("name", ""))

    def start(self, *, wait_s: float = 5.0) -> Caches:
        """Start both watches; wait up to `wait_s` for the first lists (then serve anyway, logged)."""
        self.quotas.start()
        self.namespaces_reflector.start()
        for r in (self.quotas, self.namespaces_reflector):
            if not r.wait_synced(wait_s):
                log.warning(
                    "%s: not synced after %.0fs; serving with an empty view until it is", r.name, wait_s
                )
        return self

    def stop(self) -> None:
        """End both watches (blocking until their threads stop)."""
        self.quotas.stop()
        self.namespaces_reflector.stop()


def start_caches(kubeconfig: str | None, vendors: Mapping[str, Vendor], *, wait_s: float = 5.0) -> Caches:
    """Connect with `kubeconfig` (None = in-cluster service account) and start the watches.

    Raises InvalidRequest when the kubeconfig cannot be loaded. RBAC needed: list and watch on
    resourcequotas and namespaces.
    """
    return Caches(KubeClient.from_kubeconfig(kubeconfig), vendors).start(wait_s=wait_s)
