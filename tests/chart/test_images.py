"""images/: each Dockerfile parses, names only files that exist, installs the project the way
`pip install .` does, is multi-arch-ready and runs as non-root where the component allows it; the
scripts the images carry (vgpu-init.sh, hami-certgen) work. tests/chart/test_image_build.py builds them."""

from __future__ import annotations

import base64
import configparser
import importlib.util
import os
import re
import shlex
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.chart.render import ROOT

IMAGES = ROOT / "images"
DOCKERFILES = sorted(IMAGES.glob("*/Dockerfile"))
INSTRUCTIONS = {"FROM", "ARG", "RUN", "COPY", "ADD", "WORKDIR", "ENV", "USER", "LABEL", "ENTRYPOINT", "CMD",
                "EXPOSE", "VOLUME", "HEALTHCHECK", "SHELL", "STOPSIGNAL", "ONBUILD"}  # fmt: skip


@dataclass
class Instruction:
    line: int
    op: str
    args: str


def parse(path: Path) -> list[Instruction]:
    """Dockerfile instructions with continuation lines joined; ValueError on an unknown instruction."""
    out: list[Instruction] = []
    buf, start = "", 0
    for n, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.strip()
        if not buf and (not line or line.startswith("#")):
            continue
        if not buf:
            start = n
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        buf += line
        op, _, args = buf.partition(" ")
        if op.upper() not in INSTRUCTIONS:
            raise ValueError(f"{path}:{start}: unknown instruction {op!r}")
        out.append(Instruction(start, op.upper(), args.strip()))
        buf = ""
    if buf:
        raise ValueError(f"{path}: dangling line continuation")
    return out


def copies(instrs: list[Instruction]) -> list[tuple[list[str], str, str | None]]:
    """(sources, destination, --from stage) of every COPY."""
    out = []
    for i in instrs:
        if i.op != "COPY":
            continue
        words = shlex.split(i.args)
        stage = next((w.split("=", 1)[1] for w in words if w.startswith("--from=")), None)
        words = [w for w in words if not w.startswith("--")]
        out.append((words[:-1], words[-1], stage))
    return out


def packages() -> list[str]:
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    include = cfg["options.packages.find"]["include"].split()
    return sorted({p.split(".")[0] for p in include})


def test_there_is_one_dockerfile_per_image() -> None:
    assert {p.parent.name for p in DOCKERFILES} == {"hami", "device-plugin"}


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.parent.name)
def test_dockerfile_parses_and_names_existing_files(dockerfile: Path) -> None:
    instrs = parse(dockerfile)
    assert instrs[0].op in ("ARG", "FROM")
    stages = {i.args.split()[-1] for i in instrs if i.op == "FROM" and " AS " in i.args}
    for sources, _dest, stage in copies(instrs):
        if stage is not None:
            assert stage in stages, f"COPY --from={stage}: no such stage"
            continue
        for src in sources:
            assert (ROOT / src).exists(), f"{dockerfile.relative_to(ROOT)}: COPY {src} does not exist"


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.parent.name)
def test_dockerfile_installs_the_project_like_pip_install_dot(dockerfile: Path) -> None:
    instrs = parse(dockerfile)
    copied = {
        Path(s).as_posix().rstrip("/")
        for sources, _d, stage in copies(instrs)
        if stage is None
        for s in sources
    }
    # Everything setuptools reads for `pip install .`: the metadata files and every package it finds.
    needed = {"setup.cfg", "pyproject.toml", "README.md", "LICENSE", *packages()}
    assert needed <= copied, f"missing from the build context: {sorted(needed - copied)}"
    runs = " ".join(i.args for i in instrs if i.op == "RUN")
    # The wheel of the repository root (what `pip install .` builds), installed without dependencies:
    # those come pinned and hashed from images/requirements.txt.
    assert "pip wheel --no-cache-dir --no-deps --no-build-isolation -w /wheels ." in runs
    assert "/opt/hami/bin/pip install --no-cache-dir --no-deps /wheels/*.whl" in runs
    assert "--require-hashes --only-binary=:all: -r /src/images/requirements.txt" in runs
    assert not re.search(r"pip install[^&]*(-e|--editable) ", runs), (
        "an image installs a wheel, not an editable tree"
    )


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.parent.name)
def test_dockerfile_is_multi_arch_ready(dockerfile: Path) -> None:
    instrs = parse(dockerfile)
    froms = [i for i in instrs if i.op == "FROM"]
    # The final image and what it copies from run on the target platform; only the libvgpu stage runs
    # on the build machine's (zig cross-compiles both architectures).
    for i in froms:
        platform = "$BUILDPLATFORM" if i.args.endswith(" AS libvgpu") else "$TARGETPLATFORM"
        assert f"--platform={platform}" in i.args, i.args
        assert "${BASE_IMAGE}" in i.args, i.args
    [base] = [i.args for i in instrs if i.op == "ARG" and i.args.startswith("BASE_IMAGE=")]
    # A multi-arch official image, no arch-specific tag.
    assert base == "BASE_IMAGE=debian:bookworm-slim"
    text = dockerfile.read_text()
    assert "docker buildx build --platform linux/amd64,linux/arm64" in text


def test_python_image_is_non_root_and_carries_certgen() -> None:
    instrs = parse(IMAGES / "hami" / "Dockerfile")
    users = [i.args for i in instrs if i.op == "USER"]
    assert users and users[-1].split(":")[0] not in ("0", "root")
    assert (["images/hami/certgen.py"], "/opt/hami/bin/hami-certgen", None) in copies(instrs)
    # Run as a command (the chart's Jobs exec hami-certgen): it needs its interpreter line.
    assert (IMAGES / "hami" / "certgen.py").read_text().startswith("#!/usr/bin/env python3\n")


def test_device_plugin_image_builds_libvgpu_and_carries_the_init_script() -> None:
    instrs = parse(IMAGES / "device-plugin" / "Dockerfile")
    assert any(i.op == "RUN" and "make -C libvgpu" in i.args for i in instrs)
    c = copies(instrs)
    assert (["/src/libvgpu/build/libvgpu.so"], "/k8s-vgpu/lib/nvidia/libvgpu.so", "libvgpu") in c
    assert (["images/device-plugin/vgpu-init.sh"], "/usr/local/bin/vgpu-init.sh", None) in c
    assert os.access(IMAGES / "device-plugin" / "vgpu-init.sh", os.X_OK)


# -- vgpu-init.sh -----------------------------------------------------------------------------


def run_init(dest: Path, lib: Path) -> str:
    out = subprocess.run(
        ["sh", str(IMAGES / "device-plugin" / "vgpu-init.sh"), str(dest)],
        env={**os.environ, "VGPU_LIB_SRC": str(lib)}, capture_output=True, text=True, check=True,
    )  # fmt: skip
    return out.stdout


def test_vgpu_init_installs_once_and_replaces_on_change(tmp_path: Path) -> None:
    lib, dest = tmp_path / "libvgpu.so", tmp_path / "host" / "vgpu"
    lib.write_bytes(b"\x7fELF v1")
    assert "installed" in run_init(dest, lib)
    assert (dest / "libvgpu.so").read_bytes() == b"\x7fELF v1"
    assert (dest / "ld.so.preload").read_text() == f"{dest}/libvgpu.so\n"
    assert (dest / "containers").is_dir() and (dest / "containers").stat().st_mode & 0o777 == 0o777
    inode = (dest / "libvgpu.so").stat().st_ino
    out = run_init(dest, lib)
    assert "is current" in out and "wrote" not in out
    assert (dest / "libvgpu.so").stat().st_ino == inode, "an unchanged library is left alone"
    lib.write_bytes(b"\x7fELF v2")
    assert "installed" in run_init(dest, lib)
    assert (dest / "libvgpu.so").read_bytes() == b"\x7fELF v2"
    assert (dest / "libvgpu.so").stat().st_ino != inode, "replaced by rename: mapped copies stay intact"


def test_vgpu_init_fails_clearly_without_the_library(tmp_path: Path) -> None:
    r = subprocess.run(["sh", str(IMAGES / "device-plugin" / "vgpu-init.sh"), str(tmp_path / "d")],
                       env={**os.environ, "VGPU_LIB_SRC": str(tmp_path / "absent.so")}, capture_output=True, text=True)  # fmt: skip
    assert r.returncode == 1 and "is missing from the image" in r.stderr


# -- hami-certgen -----------------------------------------------------------------------------


def certgen():
    spec = importlib.util.spec_from_file_location("hami_certgen", IMAGES / "hami" / "certgen.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class FakeApi:
    """Secrets and webhook configurations in dicts, as the API server would keep them."""

    def __init__(self, webhook: dict | None = None) -> None:
        self.secrets: dict[tuple[str, str], dict] = {}
        self.webhooks = {"hami-webhook": webhook} if webhook else {}
        self.patches: list = []
        self.reads = 0

    def read_secret(self, namespace, name):
        return self.secrets.get((namespace, name))

    def create_secret(self, namespace, body):
        key = (namespace, body["metadata"]["name"])
        if key in self.secrets:
            return False
        self.secrets[key] = body
        return True

    def read_webhook(self, name):
        self.reads += 1
        return self.webhooks.get(name)

    def patch_webhook(self, name, patch):
        import jsonpatch

        self.patches.append(patch)
        self.webhooks[name] = jsonpatch.apply_patch(self.webhooks[name], patch)


def test_certgen_creates_a_serving_certificate_signed_by_its_ca() -> None:
    from cryptography import x509

    cg, api = certgen(), FakeApi()
    hosts = "hami-webhook,hami-webhook.hami-system.svc"
    assert (
        cg.main(["create", "--namespace", "hami-system", "--secret-name", "tls", "--hosts", hosts], api=api)
        == 0
    )
    data = api.secrets[("hami-system", "tls")]["data"]
    assert api.secrets[("hami-system", "tls")]["type"] == "kubernetes.io/tls"
    cert = x509.load_pem_x509_certificate(base64.b64decode(data["tls.crt"]))
    ca = x509.load_pem_x509_certificate(base64.b64decode(data["ca.crt"]))
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(
        x509.DNSName
    )
    assert sans == ["hami-webhook", "hami-webhook.hami-system.svc"]
    cert.verify_directly_issued_by(ca)
    assert (cert.not_valid_after_utc - cert.not_valid_before_utc).days >= 3650
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is True


def test_certgen_create_keeps_an_existing_secret() -> None:
    cg, api = certgen(), FakeApi()
    args = ["create", "--namespace", "ns", "--secret-name", "tls", "--hosts", "svc.ns.svc"]
    cg.main(args, api=api)
    first = dict(api.secrets[("ns", "tls")]["data"])
    assert cg.create(api, namespace="ns", secret_name="tls", hosts=["svc.ns.svc"], validity_days=1) == "kept"
    assert api.secrets[("ns", "tls")]["data"] == first, "an upgrade must not rotate the CA"


def test_certgen_patch_sets_the_ca_on_every_webhook() -> None:
    cg = certgen()
    api = FakeApi({"webhooks": [{"name": "a", "clientConfig": {"service": {"name": "s"}}},
                                {"name": "b", "clientConfig": {"caBundle": "b2xk"}}]})  # fmt: skip
    cg.create(api, namespace="ns", secret_name="tls", hosts=["s.ns.svc"], validity_days=1)
    ca = api.secrets[("ns", "tls")]["data"]["ca.crt"]
    code = cg.main(
        ["patch", "--namespace", "ns", "--secret-name", "tls", "--webhook-name", "hami-webhook"], api=api
    )
    assert code == 0
    assert [w["clientConfig"]["caBundle"] for w in api.webhooks["hami-webhook"]["webhooks"]] == [ca, ca]
    assert api.webhooks["hami-webhook"]["webhooks"][0]["clientConfig"]["service"] == {"name": "s"}


def test_certgen_patch_waits_for_the_configuration_then_gives_up(capsys) -> None:
    cg, api = certgen(), FakeApi()
    cg.create(api, namespace="ns", secret_name="tls", hosts=["s"], validity_days=1)
    slept = []
    with pytest.raises(LookupError, match="not found after 0.01s"):
        cg.patch(api, namespace="ns", secret_name="tls", webhook_name="hami-webhook", wait_s=0.01,
                 sleep=lambda s: (slept.append(s), __import__("time").sleep(0.01)))  # fmt: skip
    assert api.reads >= 2 and slept
    assert (
        cg.main(["patch", "--namespace", "ns", "--secret-name", "absent", "--webhook-name", "w"], api=api)
        == 1
    )
    assert "no ca.crt" in capsys.readouterr().err
