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
    """The node lock is held by another live pod."""
