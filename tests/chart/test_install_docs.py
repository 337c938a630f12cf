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
