"""scripts/build_images.py names its images as the chart pulls them and can fill a registry: the
references it builds are the chart's own for the same registry and tag, and `--registry`, `--tag` and
`--push` become the buildah commands a person would type (buildah itself is replaced by a recorder
here; tests/chart/test_image_build.py runs the real builds)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from tests.chart.render import CHART, ROOT, render

sys.path.insert(0, str(ROOT / "scripts"))
import build_images  # noqa: E402 - a script, not a package

APP_VERSION = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]


def _our_images(r) -> set[str]:
    out = set()
    for o in r.objects:
        if o["kind"] in ("Deployment", "DaemonSet", "Job"):
            spec = o["spec"]["template"]["spec"]
            out |= {c["image"] for c in spec["containers"] + spec.get("initContainers", [])}
    return {i for i in out if "/kube-scheduler:" not in i}


@pytest.mark.parametrize("tag", [None, "0.1.0-rc1"])
def test_the_built_names_are_the_names_the_chart_pulls(tag) -> None:
    values = {"global": {"imageRegistry": "registry.example.com", **({"imageTag": tag} if tag else {})}}
    pulled = _our_images(render(values))
    built = {i.reference("registry.example.com", tag or APP_VERSION) for i in build_images.IMAGES}
    assert built == pulled
    assert build_images.APP_VERSION == APP_VERSION
    # Without options: local names with the chart's tag, e.g. localhost/hami-legacy/hami-device-plugin:0.1.0.
    assert {i.reference() for i in build_images.IMAGES} == {
        f"localhost/hami-legacy/hami:{APP_VERSION}",
        f"localhost/hami-legacy/hami-device-plugin:{APP_VERSION}",
    }


class Recorder:
    """Stands in for Builder.buildah (an instance attribute of the class, so called without the builder):
    records every command line and answers like a successful buildah."""

    def __init__(self) -> None:
        self.commands: list[list[str]] = []

    def __call__(self, *args: str, check: bool = True, timeout: float = 0) -> subprocess.CompletedProcess:
        self.commands.append(list(args))
        return subprocess.CompletedProcess(["buildah", *args], 0, "", "")


@pytest.fixture
def buildah(monkeypatch) -> Recorder:
    rec = Recorder()
    monkeypatch.setattr(build_images, "missing_tools", lambda: [])
    monkeypatch.setattr(build_images.Builder, "buildah", rec)
    monkeypatch.setattr(build_images.Builder, "commit_base", lambda self: None)
    return rec


def test_registry_tag_and_push_become_buildah_commands(buildah: Recorder, tmp_path) -> None:
    rc = build_images.main(
        ["--workdir", str(tmp_path), "--registry", "registry.example.com/", "--tag", "0.1.0-rc1", "--push"]
    )
    assert rc == 0
    built = [c[c.index("-t") + 1] for c in buildah.commands if c[0] == "bud"]
    pushed = [(c[-2], c[-1]) for c in buildah.commands if c[0] == "push"]
    refs = ["registry.example.com/hami-legacy/hami:0.1.0-rc1", "registry.example.com/hami-legacy/hami-device-plugin:0.1.0-rc1"]  # fmt: skip
    assert built == refs
    assert pushed == [(ref, f"docker://{ref}") for ref in refs]
    # Each push comes after its build.
    kinds = [c[0] for c in buildah.commands if c[0] in ("bud", "push")]
    assert kinds == ["bud", "push", "bud", "push"]


def test_without_push_nothing_leaves_the_machine(buildah: Recorder, tmp_path) -> None:
    assert build_images.main(["--workdir", str(tmp_path), "--image", "device-plugin"]) == 0
    assert [c[0] for c in buildah.commands] == ["bud"]
    assert f"localhost/hami-legacy/hami-device-plugin:{APP_VERSION}" in buildah.commands[0]


def test_push_needs_a_registry(buildah: Recorder, tmp_path, capsys) -> None:
    assert build_images.main(["--workdir", str(tmp_path), "--push"]) == 2
    err = capsys.readouterr().err
    assert "--push needs --registry" in err and buildah.commands == []
