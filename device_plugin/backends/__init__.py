"""Device backends: where cards and their health come from. One module per backend, one line in `_TABLE`.

Each backend module exposes ``build(options: BackendOptions) -> Backend``, which checks the options that
backend needs (raising ConfigError naming the flag) and builds it. The table below is the only list of
backends: ``--backend`` choices, `BACKENDS` and the "valid: ..." message all come from it. Modules are
imported only when chosen, so the nvidia backend's NVML binding is not needed to run the fake one.
"""

from __future__ import annotations

import importlib

from device_plugin.backends.base import Backend, BackendOptions, HealthReport
from hami.errors import ConfigError

#: ``--backend`` name -> the module whose ``build(BackendOptions)`` makes it.
_TABLE: dict[str, str] = {
    "nvidia": "device_plugin.backends.nvidia",
    "fake": "device_plugin.backends.fake",
}

#: The backend names, in table order (``--backend`` choices).
BACKENDS = tuple(_TABLE)


def make_backend(
    name: str, *, fake_config: str | None = None, preconfigured_memory_mib: int = 0, **mig: object
) -> Backend:
    """Build backend `name` (one of `BACKENDS`). Raises ConfigError for an unknown name, or what the
    backend's ``build`` raises for options it needs (``--fake-config`` for ``fake``). `mig` takes the
    MIG fields of `BackendOptions` (operating_mode, mig_strategy, mig_allowlist)."""
    module = _TABLE.get(name)
    if module is None:
        raise ConfigError(f"--backend: {name!r} is not a backend; valid: {', '.join(BACKENDS)}")
    options = BackendOptions(
        fake_config=fake_config,
        preconfigured_memory_mib=preconfigured_memory_mib,
        **mig,  # type: ignore[arg-type]
    )
    return importlib.import_module(module).build(options)


__all__ = ["BACKENDS", "Backend", "BackendOptions", "HealthReport", "make_backend"]
