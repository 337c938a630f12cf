"""Device backends: where cards and their health come from. One module per backend, one line below."""

from __future__ import annotations

from device_plugin.backends.base import Backend, HealthReport
from hami.errors import ConfigError

BACKENDS = ("nvidia", "fake")


def make_backend(name: str, *, fake_config: str | None = None, preconfigured_memory_mib: int = 0) -> Backend:
    """Build backend `name` (one of `BACKENDS`). Raises ConfigError for an unknown name or missing file."""
    if name == "fake":
        if not fake_config:
            raise ConfigError(
                "--fake-config: required with --backend fake (a YAML file with a 'cards:' list)"
            )
        from device_plugin.backends.fake import FakeBackend

        return FakeBackend(fake_config)
    if name == "nvidia":
        from device_plugin.backends.nvidia import NvidiaBackend

        return NvidiaBackend(preconfigured_memory_mib=preconfigured_memory_mib)
    raise ConfigError(f"--backend: {name!r} is not a backend; valid: {', '.join(BACKENDS)}")


__all__ = ["BACKENDS", "Backend", "HealthReport", "make_backend"]
