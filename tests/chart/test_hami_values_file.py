"""An operator's HAMi values file (tests/chart/data/hami-v2.10-values.yaml, HAMi v2.10's chart defaults)
given to this chart: HAMi's own flags and images, which would crash-loop a pod here, are refused at render
time with the key named; after the edits docs/install.md lists, the file renders, every object validates
strictly and every container's flags parse with our real parsers."""

from __future__ import annotations

import copy
import re
from pathlib import Path

import helm_python
import pytest
import yaml

from hami.config import load_config
from tests.chart.render import ROOT, render
from tests.chart.schemas import validate
from tests.chart.test_chart_fit import FOREIGN, containers, parsed, parser_for

HAMI_VALUES = yaml.safe_load((Path(__file__).parent / "data" / "hami-v2.10-values.yaml").read_text())
VALIDATE = (ROOT / "helm" / "hami" / "templates" / "validate.yaml").read_text()


def migrated(values: dict) -> dict:
    """The edits of docs/install.md's "Migrating from HAMi": drop HAMi's images, its image tag and its
    flag lists."""
    v = copy.deepcopy(values)
    v["global"].pop("imageTag")
    v["scheduler"]["kubeScheduler"].pop("image")
    v["scheduler"]["kubeScheduler"].pop("extraArgs")
    v["scheduler"]["extender"].pop("image")
    v["scheduler"]["extender"].pop("extraArgs")
    v["devicePlugin"].pop("image")
    v["devicePlugin"].pop("extraArgs")
    return v


def without(values: dict, *paths: str) -> dict:
    v = copy.deepcopy(values)
    for path in paths:
        *parents, leaf = path.split(".")
        node = v
        for p in parents:
            node = node[p]
        node.pop(leaf)
    return v


# (what is left in the file, the key the error must name, the offending value)
STEPS = [
    ((), "scheduler.kubeScheduler.extraArgs", "--policy-config-file=/config/config.json"),
    (("scheduler.kubeScheduler.extraArgs",), "scheduler.extender.extraArgs", "--debug"),
    (("scheduler.kubeScheduler.extraArgs", "scheduler.extender.extraArgs"), "devicePlugin.extraArgs", "-v=false"),
    (
        ("scheduler.kubeScheduler.extraArgs", "scheduler.extender.extraArgs", "devicePlugin.extraArgs"),
        "image.repository",
        "projecthami/hami",
    ),
]


@pytest.mark.parametrize(("removed", "key", "value"), STEPS, ids=[s[1] for s in STEPS])
def test_hami_flags_and_images_are_refused_naming_the_key(removed: tuple, key: str, value: str) -> None:
    with pytest.raises(helm_python.HelmRenderError) as e:
        render(without(HAMI_VALUES, *removed))
    assert key in str(e.value) and f'"{value}"' in str(e.value), str(e.value)


@pytest.mark.parametrize("kube_version", ["v1.23.0", "v1.30.0"])
def test_the_migrated_file_renders_validates_and_parses(kube_version: str) -> None:
    r = render(migrated(HAMI_VALUES), kube_version=kube_version)
    for o in r.objects:
        validate(o, kube_version)
    for _o, _spec, c in containers(r):
        command = c["command"][0]
        if command in FOREIGN:
            assert {a.split("=")[0] for a in c.get("args", []) if a.startswith("-")} <= FOREIGN[command]
        else:
            parsed(c)
    # HAMi's knobs that the file sets still arrive.
    [dp] = r.find("DaemonSet", "hami-device-plugin")
    assert dp["spec"]["template"]["spec"]["nodeSelector"] == {"gpu": "on"}
    cfg = yaml.safe_load(r.one("ConfigMap", "hami-scheduler-device")["data"]["device-config.yaml"])
    assert cfg["nvidia"]["deviceSplitCount"] == 10 and cfg["nvidia"]["gpuCorePolicy"] == "default"


def _refused(component: str) -> list[str]:
    """The flags validate.yaml refuses in `component`'s extraArgs (its `has $flag (list ...)`)."""
    block = VALIDATE.split(f"range .Values.{component}.extraArgs" if component == "devicePlugin" else
                           f"range $s.{component}.extraArgs")[1].split("{{- end }}")[0]  # fmt: skip
    [listed] = re.findall(r'\(list ((?:"[^"]+" ?)+)\)', block)
    return re.findall(r'"([^"]+)"', listed)


@pytest.mark.parametrize(
    ("component", "command"), [("extender", "hami-scheduler-extender"), ("devicePlugin", "hami-device-plugin")]
)
def test_the_chart_refuses_only_flags_our_parsers_reject(component: str, command: str) -> None:
    # A refused flag that our parser accepted would block a valid install.
    refused = _refused(component)
    assert len(refused) >= 5, refused  # the list was found
    known = set(parser_for(command)._option_string_actions)  # noqa: SLF001 - the parser's own flag table
    assert not known & set(refused), known & set(refused)


def test_our_own_flags_in_extra_args_still_pass() -> None:
    r = render({
        "scheduler": {"extender": {"extraArgs": ["--filter-mode", "all", "--kube-qps=50"]},
                      "kubeScheduler": {"extraArgs": ["-v=4"]}},
        "devicePlugin": {"extraArgs": ["-v"]},
    })  # fmt: skip
    [ext] = [c for _o, _s, c in containers(r) if c["name"] == "hami-scheduler-extender"]
    assert parsed(ext).filter_mode == "all"


@pytest.mark.parametrize(
    ("values", "where", "complaint"),
    [
        # kube-scheduler refuses a managedResources name without a domain and would not start.
        ({"resourceName": "gpu"}, "/resourceName", "'gpu' does not match pattern"),
        (
            {"devices": {"ascend": {"enabled": True, "customresources": ["Ascend910A"]}}},
            "/devices/ascend/customresources/0",
            "'Ascend910A' does not match pattern",
        ),
        # The API server rejects a pod whose pull secret is a bare string, after the release is half made.
        ({"global": {"imagePullSecrets": ["regcred"]}}, "/global/imagePullSecrets/0", "want object"),
        ({"imagePullSecrets": [{"nam": "regcred"}]}, "/imagePullSecrets/0", "missing property 'name'"),
        # A misspelt per-node key would be ignored without a word.
        (
            {"devicePlugin": {"nodeconfig": [{"name": "n1", "devicesplitcnt": 3}]}},
            "/devicePlugin/nodeconfig/0",
            "additional properties 'devicesplitcnt' not allowed",
        ),
    ],
    ids=["resource-without-domain", "customresource-without-domain", "pull-secret-string", "pull-secret-no-name",
         "nodeconfig-typo"],
)  # fmt: skip
def test_more_bad_values_are_refused_naming_the_key(values: dict, where: str, complaint: str) -> None:
    with pytest.raises(helm_python.HelmValuesError) as e:
        render(values)
    assert f"at '{where}'" in str(e.value) and complaint in str(e.value), str(e.value)


def test_hamis_per_node_keys_pass_in_any_case() -> None:
    # HAMi's device plugin decodes its per-node JSON with Go's case-insensitive matching.
    node = {"name": "n1", "deviceSplitCount": 3, "operatingmode": "hami-core", "filterdevices": {"uuid": []},
            "DeviceMemoryScaling": 1.5}  # fmt: skip
    r = render({"devicePlugin": {"nodeconfig": [node]}})
    cfg = yaml.safe_load(r.one("ConfigMap", "hami-scheduler-device")["data"]["device-config.yaml"])
    assert cfg["nodeconfig"] == [node]
    override = load_config(cfg).nodes["n1"]  # what the device plugin reads on node n1
    assert (override.deviceSplitCount, override.deviceMemoryScaling) == (3, 1.5)


def test_hamis_node_ports_and_service_annotations_survive_the_migration() -> None:
    # HAMi's values: NodePort Services on 31993 (scheduler) and 31992 (monitor), scraped on the nodes there.
    values = migrated(HAMI_VALUES)
    values["devicePlugin"]["service"]["annotations"] = {"prometheus.io/scrape": "true"}
    r = render(values)
    sched, mon = r.one("Service", "hami-scheduler"), r.one("Service", "hami-device-plugin-monitor")
    assert (sched["spec"]["type"], sched["spec"]["ports"][0]["nodePort"]) == ("NodePort", 31993)
    assert (mon["spec"]["type"], mon["spec"]["ports"][0]["nodePort"]) == ("NodePort", 31992)
    assert mon["metadata"]["annotations"] == {"prometheus.io/scrape": "true"}
    for o in (sched, mon):
        validate(o, "v1.30.0")


@pytest.mark.parametrize("service_type", ["ClusterIP", "NodePort"])
def test_a_port_outside_the_node_port_range_gets_no_fixed_node_port(service_type: str) -> None:
    r = render({"scheduler": {"service": {"type": service_type}}, "devicePlugin": {"service": {"type": service_type}}})
    for name in ("hami-scheduler", "hami-device-plugin-monitor"):
        svc = r.one("Service", name)
        assert svc["spec"]["type"] == service_type and "nodePort" not in svc["spec"]["ports"][0], svc


@pytest.mark.parametrize("legacy", [True, False])
def test_hamis_legacy_metrics_key_reaches_the_monitor(legacy: bool) -> None:
    values = migrated(HAMI_VALUES)
    values["legacyMetrics"] = legacy
    [mon] = [c for _o, _s, c in containers(render(values)) if c["name"] == "hami-vgpu-monitor"]
    assert parsed(mon).legacy_metrics is legacy


@pytest.mark.parametrize(
    ("force", "takeover", "want"),
    [(True, None, "default-scheduler"), (False, None, ""), (False, "default-scheduler,volcano", "volcano")],
    ids=["hami-default", "force-off", "force-off-keeps-others"],
)
def test_hamis_force_overwrite_default_scheduler_reaches_the_webhook(force: bool, takeover, want: str) -> None:
    values = migrated(HAMI_VALUES)
    values["scheduler"]["forceOverwriteDefaultScheduler"] = force
    if takeover:
        values["scheduler"]["admissionWebhook"]["takeoverSchedulers"] = takeover
    [hook] = [c for _o, _s, c in containers(render(values)) if c["name"] == "hami-webhook"]
    assert parsed(hook).takeover_schedulers == want


@pytest.mark.parametrize(
    ("values", "key"),
    [
        ({"scheduler": {"nodeLabelSelector": {"gpu-pool": "a"}}}, "scheduler.nodeLabelSelector"),
        ({"global": {"managedNodeSelectorEnable": True, "managedNodeSelector": {"usage": "gpu"}}},
         "global.managedNodeSelectorEnable"),
    ],
    ids=["nodeLabelSelector", "managedNodeSelector"],
)  # fmt: skip
def test_hami_placement_knobs_we_lack_are_refused(values: dict, key: str) -> None:
    # Ignored, they would let GPU pods land on nodes the operator excluded.
    with pytest.raises(helm_python.HelmRenderError, match=re.escape(key) + " .*not supported"):
        render(values)


def test_hamis_defaults_for_those_knobs_render() -> None:
    render({"scheduler": {"nodeLabelSelector": {}}, "global": {"managedNodeSelectorEnable": False}})
