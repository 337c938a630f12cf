"""What docs/install.md, NOTES.txt and the project's metadata tell an installer agrees with the chart:
Pod Security Admission labels for the privileged device plugin, one project URL everywhere (not
upstream HAMi's), a support pointer with the version matrix."""

from __future__ import annotations

import configparser
import re

import yaml

from tests.chart.render import CHART, NAMESPACE, ROOT, render

DOC = (ROOT / "docs" / "install.md").read_text()
PROJECT = "https://github.com/hami-legacy/hami-legacy"


def test_the_device_plugin_needs_privileged_and_the_install_labels_for_it() -> None:
    r = render()
    spec = r.one("DaemonSet", "hami-device-plugin")["spec"]["template"]["spec"]
    # What Pod Security's baseline level refuses: a privileged container, hostPath volumes, hostPID.
    assert any((c.get("securityContext") or {}).get("privileged") for c in spec["containers"])
    assert any("hostPath" in v for v in spec["volumes"]) and spec.get("hostPID") is True
    install = DOC.split("## Install\n")[1].split("```")[1]
    assert f"kubectl create namespace {NAMESPACE}" in install and "--create-namespace" not in install
    assert re.search(
        rf"kubectl label namespace {NAMESPACE} pod-security\.kubernetes\.io/enforce=privileged", install
    )
    assert install.index("kubectl label namespace") < install.index("helm install")
    assert f"kubectl label namespace {NAMESPACE} pod-security.kubernetes.io/enforce=privileged" in r.notes


def test_one_project_url_everywhere_and_none_upstream() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["home"] == PROJECT and chart["sources"] == [PROJECT]
    assert chart["icon"] == "https://raw.githubusercontent.com/hami-legacy/hami-legacy/main/docs/icon.svg"
    assert (ROOT / "docs" / "icon.svg").read_text().startswith("<svg")
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    assert cfg["metadata"]["url"] == PROJECT
    for image in ("hami", "device-plugin"):
        text = (ROOT / "images" / image / "Dockerfile").read_text()
        assert f'org.opencontainers.image.source="{PROJECT}"' in text
    assert f"{PROJECT}/issues" in render().notes


def test_support_says_where_to_report_and_what_is_supported() -> None:
    support = DOC.split("## Support\n")[1].split("\n## ")[0]
    assert f"{PROJECT}/issues" in support
    for row in ("Kubernetes (API server)", "kube-scheduler image", "CUDA in the workload images", "NVIDIA driver",
                "Helm", "HAMi"):  # fmt: skip
        assert f"| {row} |" in support, row
    assert "1.23 to 1.33" in support and "R580" in support and "525.60.13" in support
    readme = (ROOT / "README.md").read_text()
    assert f"{PROJECT}/issues" in readme and "docs/install.md#support" in readme


def test_the_hami_command_is_explained_before_its_first_use() -> None:
    # An operator meets `hami inspect` / `hami explain` here first: say where the command comes from.
    heading = DOC.index("### The `hami` command\n")
    assert heading < min(DOC.index(f"`hami {verb}") for verb in ("inspect", "explain"))
    section = DOC[heading:].split("\n#", 1)[0]
    assert "pip install ." in section and "hami-legacy" in section
    exec_line = re.search(
        r"kubectl -n (\S+) exec deploy/(\S+) -c (\S+) -- \\\n\s+hami inspect --device-config (\S+)", section
    )
    assert exec_line, "the image route (kubectl exec ... hami inspect) is not given before the first use"
    ns, deploy, container, config = exec_line.groups()
    # The command runs where the doc says: that container of that Deployment, with the device config there.
    spec = render().one("Deployment", deploy)["spec"]["template"]["spec"]
    assert ns == NAMESPACE
    [c] = [c for c in spec["containers"] if c["name"] == container]
    assert any(config.startswith(m["mountPath"] + "/") for m in c["volumeMounts"]), c["volumeMounts"]
    assert f"--device-config={config}" in c["args"] or f"--config={config}" in c["args"]


def test_security_reports_go_to_a_private_channel() -> None:
    support = DOC.split("## Support\n")[1].split("\n## ")[0]
    assert f"{PROJECT}/security/advisories/new" in support
    assert "same tracker" not in support
