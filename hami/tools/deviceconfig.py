"""The device config the scheduler uses, read from the cluster: the chart's device ConfigMap.

`hami inspect`, `hami explain` and `hami simulate --from-cluster` read nodes and pods through the
scheduler's `device-config.yaml`: with HAMi's defaults instead, an Ascend node reads as unregistered
(Ascend is off by default), an NPU pod as no device pod, a renamed resource as nothing. So, unless a
file is given (`--device-config` / `--config`), they read the ConfigMap the scheduler mounts:

1. `--device-configmap NAMESPACE/NAME` when given (absent: NotFound, exit 5);
2. else the Helm chart's default, ``hami-system/hami-scheduler-device``;
3. else the one ConfigMap labelled ``app.kubernetes.io/component=device-config`` (the chart's label,
   any release name or namespace);
4. else HAMi's defaults, with a warning saying so (also when the credentials may not read ConfigMaps).

RBAC: get on that ConfigMap, list of configmaps for step 3.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import yaml

from hami.config import DeviceConfig, load_config
from hami.errors import ApiError, ConfigError, InvalidRequest, NotFound

DEFAULT_CONFIGMAP = "hami-system/hami-scheduler-device"
KEY = "device-config.yaml"
LABEL = "app.kubernetes.io/component=device-config"


@dataclass(frozen=True, slots=True)
class ClusterConfig:
    """The device config found, where it came from (for reports), and a warning when it is the default."""

    config: DeviceConfig
    source: str
    warning: str | None = None


def parse_ref(ref: str) -> tuple[str, str]:
    """NAMESPACE/NAME -> (namespace, name); InvalidRequest naming the flag otherwise."""
    ns, sep, name = ref.partition("/")
    if not sep or not ns or not name or "/" in name:
        raise InvalidRequest(f"--device-configmap {ref!r}: want NAMESPACE/NAME, e.g. {DEFAULT_CONFIGMAP}")
    return ns, name


def from_configmap(cm: dict[str, Any]) -> DeviceConfig:
    """The DeviceConfig of a ConfigMap object (its `device-config.yaml` key). InvalidRequest names the
    ConfigMap and the key when it is missing, not YAML, or not a valid device config."""
    meta = cm.get("metadata") or {}
    where = f"configmap {meta.get('namespace', '')}/{meta.get('name', '')}"
    text = (cm.get("data") or {}).get(KEY)
    if text is None:
        raise InvalidRequest(f"{where}: no key {KEY}")
    try:
        return load_config(yaml.safe_load(text))
    except yaml.YAMLError as e:
        raise InvalidRequest(f"{where} {KEY}: invalid YAML: {' '.join(str(e).split())}") from None
    except ConfigError as e:
        raise InvalidRequest(f"{where} {KEY}: {' '.join(str(e).split())}") from None


def read(client: Any, ref: str | None = None) -> ClusterConfig:
    """The scheduler's device config from the cluster (the order in the module docstring).

    Raises NotFound when `ref` is given and absent, InvalidRequest for a bad ref or a ConfigMap that
    does not hold a valid device config, ApiError when the API server cannot be reached or refuses a
    named `ref`.
    """
    if ref is not None:
        ns, name = parse_ref(ref)
        cm = client.get("configmaps", name, namespace=ns)
        if cm is None:
            raise NotFound(f"configmap {ns}/{name} not found (--device-configmap)")
        return ClusterConfig(from_configmap(cm), f"configmap {ns}/{name}")
    ns, name = parse_ref(DEFAULT_CONFIGMAP)
    try:
        cm = client.get("configmaps", name, namespace=ns)
        if cm is None:
            found = sorted(client.list("configmaps", label_selector=LABEL), key=_ref)
            if len(found) > 1:
                raise InvalidRequest(
                    f"{len(found)} device ConfigMaps ({', '.join(_ref(c) for c in found)}): name the "
                    "scheduler's with --device-configmap NAMESPACE/NAME"
                )
            cm = found[0] if found else None
    except ApiError as e:
        if e.status not in (401, 403):
            raise
        cm, denied = None, f" ({' '.join(str(e).split())})"
    else:
        denied = ""
    if cm is None:
        return ClusterConfig(
            load_config(None),
            "HAMi's defaults",
            f"no device ConfigMap found ({DEFAULT_CONFIGMAP}, or labelled {LABEL}){denied}; using HAMi's "
            "defaults (Ascend and Iluvatar off): give --device-configmap NAMESPACE/NAME or a file",
        )
    return ClusterConfig(from_configmap(cm), f"configmap {_ref(cm)}")


def _ref(cm: dict[str, Any]) -> str:
    meta = cm.get("metadata") or {}
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"
