"""Moved to `hami.tls` (shared by the webhook and the scheduler extender); this name stays importable."""

from hami.tls import ReloadingTLS, ReloadStats

__all__ = ["ReloadStats", "ReloadingTLS"]
