"""Why an Allocate cannot be answered, as typed errors; no protocol here.

The allocator raises these; the gRPC service (`device_plugin.routes`) alone turns them into status
codes, so the policy that decides never needs to know how kubelet is spoken to.
"""

from __future__ import annotations


class AllocationRefused(Exception):
    """Allocate cannot be answered for a reason of the pod or the node (gRPC FAILED_PRECONDITION).

    `reason` is a short metric label (``lock_missing``), `message` what kubelet shows in the pod's events.
    """

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


class ApiUnavailable(AllocationRefused):
    """The API server could not be read or written; kubelet may retry (gRPC UNAVAILABLE)."""
