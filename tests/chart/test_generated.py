"""Generated files are current: deploy/hami.yaml and the chart's dashboards (scripts/gen_deploy.py),
and docs/install.md's values reference (scripts/gen_values_reference.py); the static manifests are
valid for every Kubernetes version they claim."""

from __future__ import annotations

import importlib.util
import json

import pytest
import yaml

from tests.chart.conftest import rendered
from tests.chart.render import ROOT, render
from tests.chart.schemas import validate


def script(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_deploy_manifest_and_chart_dashboards_are_current(capsys) -> None:
    assert script("gen_deploy").main(["--check"]) == 0, capsys.readouterr().err


def test_values_reference_is_current(capsys) -> None:
    assert script("gen_values_reference").main(["--check"]) == 0, capsys.readouterr().err


def test_every_value_is_documented() -> None:
    gen = script("gen_values_reference")
    text = (ROOT / "helm" / "hami" / "values.yaml").read_text()
    documented = {k for k, _ in gen.documented_keys(text)}

    def leaves(node, prefix=""):
        for k, v in node.items():
            key = f"{prefix}{k}"
            if isinstance(v, dict) and v and key not in documented:
                yield from leaves(v, key + ".")
            else:
                yield key

    undocumented = [k for k in leaves(yaml.safe_load(text)) if k not in documented]
    assert not undocumented, f"values without a '# --' comment: {undocumented}"
    doc = (ROOT / "docs" / "install.md").read_text()
    assert '| `scheduler.defaultSchedulerPolicy.nodeSchedulerPolicy` | `"binpack"` |' in doc


@pytest.mark.parametrize("kube_version", ["v1.25.0", "v1.28.0", "v1.33.0"])
def test_static_manifests_validate(kube_version: str) -> None:
    objects = [o for o in yaml.safe_load_all((ROOT / "deploy" / "hami.yaml").read_text()) if o]
    # Pod Security Admission: the device plugin DaemonSet (privileged, hostPath, hostPID) is admitted only
    # at the privileged level.
    psa = {f"pod-security.kubernetes.io/{mode}": "privileged" for mode in ("enforce", "audit", "warn")}
    assert objects[0] == {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": "hami-system", "labels": psa},
    }
    assert all(validate(o, kube_version) for o in objects)
    assert not any(
        k.startswith("helm.sh/") for o in objects for k in (o["metadata"].get("annotations") or {})
    )
    # The same objects as the chart renders (less Helm's bookkeeping), nothing hand-edited.
    names = sorted(f"{o['kind']}/{o['metadata']['name']}" for o in objects[1:])
    assert names == sorted(render(kube_version="v1.25.0").names())


def test_dashboards_config_map_carries_every_dashboard() -> None:
    files = {p.name: p.read_text() for p in sorted((ROOT / "dashboards").glob("*.json"))}
    assert files, "no dashboards/*.json: the chart ships them (scripts/gen_deploy.py copies them)"
    r = render({"dashboards": {"enabled": True}})
    cm = r.one("ConfigMap", "hami-dashboards")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert {k: json.loads(v) for k, v in cm["data"].items()} == {k: json.loads(v) for k, v in files.items()}
    assert rendered("defaults").find("ConfigMap", "hami-dashboards") == []


def test_example_device_config_is_current_and_loads_into_the_defaults(capsys) -> None:
    from hami.config import SchedulerConfig, load_config
    from hami.vendors import VENDOR_SECTIONS

    assert script("gen_example_config").main(["--check"]) == 0, capsys.readouterr().err
    text = (ROOT / "examples" / "device-config.yaml").read_text()
    cfg = load_config(yaml.safe_load(text))
    for key, entry in VENDOR_SECTIONS.items():
        assert cfg.section(key) == entry.config(), key
    assert cfg.scheduler == SchedulerConfig()
    assert set(yaml.safe_load(text)) == {*VENDOR_SECTIONS, "scheduler", "nodeconfig"}


def test_every_key_of_the_example_is_commented() -> None:
    lines = (ROOT / "examples" / "device-config.yaml").read_text().splitlines()
    keys = 0
    for i, line in enumerate(lines):
        stripped = line.lstrip(" -")
        if not stripped or stripped.startswith("#") or ":" not in stripped:
            continue
        keys += 1
        assert lines[i - 1].lstrip().startswith("#"), f"line {i + 1} has no comment above it: {line!r}"
    assert keys > 100
