"""Both images build from their Dockerfiles, unchanged, and what they carry runs.

scripts/build_images.py builds each with buildah (`--isolation chroot`, vfs storage) over a
debootstrapped `debian:bookworm-slim` stand-in, with the network of the host (Debian's mirror, PyPI):
every RUN, COPY and ENV of the Dockerfile runs as a container builder runs it. Then, in one container
of each image: every entry point's `--help`, the Python packages against images/requirements.txt, the
labels, the user, and for the device plugin the libvgpu builds and vgpu-init.sh. Needs root,
debootstrap and buildah (`.ci/run` installs them); several minutes, most of it downloads and vfs copies.
"""

from __future__ import annotations

import re
import struct
import sys
from collections.abc import Iterator

import pytest

from tests.chart.render import ROOT
from tests.ci import skip_or_fail

sys.path.insert(0, str(ROOT / "scripts"))
import build_images  # noqa: E402 - a script, not a package

pytestmark = pytest.mark.slow
PROJECT_URL = "https://github.com/hami-legacy/hami-legacy"
IMAGES = {i.name: i for i in build_images.IMAGES}


@pytest.fixture(scope="module")
def builder() -> Iterator[build_images.Builder]:
    if missing := build_images.missing_tools():
        skip_or_fail(f"building the images needs {', '.join(missing)} (apt-get install debootstrap buildah)")
    b = build_images.Builder(ROOT / "build" / "images", log=lambda _msg: None)
    yield b
    b.remove_storage()  # vfs keeps a full copy per layer; the debootstrapped base tarball stays


@pytest.fixture(scope="module", params=sorted(IMAGES))
def built(builder: build_images.Builder, request: pytest.FixtureRequest):
    """(image, the container's results): one build and one container per image."""
    image = IMAGES[request.param]
    builder.build(image)
    with builder.container(image) as ctr:
        results = {
            "help": {c: ctr.run(*c) for c in image.entry_points},
            "site": sorted(p.name for p in ctr.root.glob("opt/hami/lib/python3*/site-packages/*.dist-info")),
            "leftovers": {p: ctr.read(p) for p in ("/etc/pip.conf", "/etc/hami-build-ca.crt")},
            "absent": [p for p in ("/opt/build", "/wheels", "/src") if (ctr.root / p.lstrip("/")).exists()],
        }
        if image.name == "device-plugin":
            results["libs"] = {
                arch: ctr.read(f"/k8s-vgpu/lib/nvidia/{arch}/libvgpu.so") for arch in ("x86_64", "aarch64")
            }
            results["own"] = ctr.read("/k8s-vgpu/lib/nvidia/libvgpu.so")
            results["init"] = ctr.run("sh", "-c", "vgpu-init.sh /tmp/vgpu && cat /tmp/vgpu/ld.so.preload")
    return image, results, builder.inspect(image)["OCIv1"]["config"]


def test_every_entry_point_runs_inside_the_image(built) -> None:
    image, results, _config = built
    for command, r in results["help"].items():
        assert r.returncode == 0, (
            f"{image.name}: {' '.join(command)} exited {r.returncode}:\n{r.stdout}{r.stderr}"
        )
        assert r.stdout.startswith("usage: "), (command, r.stdout[:200])


def _locked() -> dict[str, str]:
    text = (ROOT / "images" / "requirements.txt").read_text()
    return {
        m[0].lower().replace("_", "-"): m[1] for m in re.findall(r"^([A-Za-z0-9_.-]+)==(\S+)", text, re.M)
    }


def test_the_image_holds_exactly_the_locked_packages(built) -> None:
    _image, results, _config = built
    installed = {}
    for name in results["site"]:
        dist, version = name.removesuffix(".dist-info").rsplit("-", 1)
        installed[dist.lower().replace("_", "-")] = version
    # pip and setuptools are the virtual environment's own (Debian's python3-venv); hami-legacy is ours.
    venv_own = {k: installed.pop(k) for k in ("pip", "setuptools")}
    assert installed.pop("hami-legacy") == "0.1.0" and set(venv_own) == {"pip", "setuptools"}
    assert installed == _locked()


def test_build_time_files_stay_out_of_the_image(built) -> None:
    _image, results, _config = built
    assert results["absent"] == [], "build stages leak into the image"
    # The host CA and pip.conf are bind-mounted into the build steps; at most their empty mount
    # points remain.
    assert all(content in (None, b"") for content in results["leftovers"].values()), results["leftovers"]


def test_labels_and_user(built) -> None:
    image, _results, config = built
    labels = config["Labels"]
    assert labels["org.opencontainers.image.source"] == PROJECT_URL
    assert labels["org.opencontainers.image.licenses"] == "Apache-2.0"
    assert not any("Project-HAMi" in v for v in labels.values())
    assert (config.get("User") or "root") == ("65532:65532" if image.name == "hami" else "root")
    assert "/opt/hami/bin" in next(e for e in config["Env"] if e.startswith("PATH="))


# ELF e_machine of each architecture, and the newest GLIBC_ version a portable library may need.
MACHINES = {"x86_64": 62, "aarch64": 183}


def _elf_machine(data: bytes) -> int:
    assert data[:4] == b"\x7fELF" and data[4] == 2, "a 64-bit ELF"
    return struct.unpack_from("<H", data, 18)[0]


def test_device_plugin_image_carries_portable_libvgpu_and_installs_it(built) -> None:
    image, results, _config = built
    if image.name != "device-plugin":
        return
    for arch, data in results["libs"].items():
        assert data is not None, f"{arch}/libvgpu.so missing"
        assert _elf_machine(data) == MACHINES[arch]
        versions = {tuple(int(x) for x in v.split(b".")) for v in re.findall(rb"GLIBC_([0-9.]+[0-9])", data)}
        assert versions and max(versions) <= (2, 17), f"{arch}: needs GLIBC_{max(versions)}"
    assert results["own"] == results["libs"]["x86_64"], "the build machine here is x86_64: its own copy"
    assert results["init"].returncode == 0, results["init"].stderr
    assert results["init"].stdout.strip().endswith("/tmp/vgpu/libvgpu.so")


def test_the_lock_covers_what_setup_cfg_requires() -> None:
    # Runs without buildah: a dependency added to setup.cfg and not to the lock fails here first.
    import configparser

    from packaging.requirements import Requirement

    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    locked = _locked()
    for line in filter(None, (x.strip() for x in cfg["options"]["install_requires"].splitlines())):
        req = Requirement(line)
        name = req.name.lower().replace("_", "-")
        assert name in locked, f"{name}: in setup.cfg, not in images/requirements.txt (regenerate it)"
        assert req.specifier.contains(locked[name]), f"{name}=={locked[name]} does not satisfy {req}"
    text = (ROOT / "images" / "requirements.txt").read_text()
    for block in re.split(r"\n(?=\S)", text):
        if "==" in block.split("\n")[0]:
            assert "--hash=sha256:" in block, f"unhashed pin: {block.splitlines()[0]}"
    build = (ROOT / "images" / "build-requirements.txt").read_text()
    assert re.search(r"^nvidia-cuda-runtime==13\.", build, re.M) and re.search(r"^ziglang==", build, re.M)


def test_both_dockerfiles_install_from_the_locks_only() -> None:
    for image in IMAGES.values():
        text = image.dockerfile.read_text()
        installs = re.findall(r"^(?!\s*#).*pip install[^\n]*", text, re.M)
        assert installs, image.name
        for line in installs:
            assert "--require-hashes" in line or "--no-deps /wheels/" in line, line
        assert "FROM" in text and "nvidia/cuda" not in text and "python:" not in text
        assert PROJECT_URL in text and "Project-HAMi" not in text
