"""One small error hierarchy for the whole project.

Servers map these to their protocol's answer at the edge (HTTP status, extender ``Error`` text,
admission denial, gRPC status), so the core raises meaningful types and never formats protocol
answers itself. Messages name the offending field and, where there is a closed set, the valid values.
"""


class HamiError(Exception):
    """Base class of every error this project raises on purpose."""


class InvalidRequest(HamiError, ValueError):
    """Bad user input: a pod field, a quantity, a policy name. The message names the field."""


class AnnotationError(InvalidRequest):
    """A malformed annotation value; the message names the key, the entry and the field."""


class ConfigError(InvalidRequest):
    """An invalid device configuration value; the message names the key."""


class NotFound(HamiError):
    """The object does not exist (HTTP 404)."""


class Conflict(HamiError):
    """Optimistic concurrency failed or the object already exists (HTTP 409)."""


class NodeLockContention(Conflict):
    """The node lock is held by another live pod.

    `expires_in_s`: seconds until the lock may be taken over by its age (``--node-lock-timeout``),
    as the locker's clock sees it; None when unknown. A bind waiting for the lock wakes then.
    """

    def __init__(self, message: str, *, expires_in_s: float | None = None) -> None:
        super().__init__(message)
        self.expires_in_s = expires_in_s


class ApiError(HamiError):
    """An API server error that is neither NotFound, Conflict nor InvalidRequest (5xx, 429, 403, ...).

    `status` is the HTTP status (None for a transport failure), `reason` the Status body's reason
    (``"Transport"`` when the server could not be reached).
    """

    def __init__(self, message: str, *, status: int | None = None, reason: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason


class ResourceExpired(ApiError):
    """``410 Gone``/``Expired``: the resourceVersion is older than the server's history; relist."""
