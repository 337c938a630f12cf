"""Build both images from their Dockerfiles without a container daemon or a registry (buildah).

    python scripts/build_images.py                 # build images/hami and images/device-plugin
    python scripts/build_images.py --run-help      # ... and run every entry point's --help inside each
    python scripts/build_images.py --registry registry.example.com --push   # ... and push them there

The images are named as the chart pulls them, `<registry>/hami-legacy/hami:<tag>` and
`<registry>/hami-legacy/hami-device-plugin:<tag>`: registry `localhost` (they then stay in buildah's
storage under --workdir) and the chart's appVersion as the tag unless --registry / --tag say otherwise.
--push sends each to its registry with `buildah push` (log in first: `buildah login <registry>`); the
images are for the architecture of the machine that builds them.

What a CI machine without Docker can do, and what tests/chart/test_image_build.py runs: the base image
`debian:bookworm-slim` the Dockerfiles start from cannot be pulled here, so it is made locally with
`debootstrap --variant=minbase bookworm` (the same suite and variant the official slim image is made
from, with its apt sources) and committed under that name; then `buildah bud --isolation chroot` with
vfs storage runs every Dockerfile instruction, unchanged, with the network of the host (Debian's
mirror and PyPI). Nothing outside `--workdir` (default build/images under the repository root, ignored
by git) is written: buildah's storage, run directory and signature policy live there, and the
debootstrapped base is kept there as a tarball, so a second run skips debootstrap.

Needs root, `debootstrap` and `buildah` (Debian: `apt-get install debootstrap buildah`). Where the host
reaches PyPI through a TLS proxy, the host's CA bundle (SSL_CERT_FILE, else Debian's) is bind-mounted
read-only into each build step with a pip.conf naming it; the images themselves never carry either.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: The chart's appVersion: the tag the chart pulls when global.imageTag is empty.
APP_VERSION = re.search(
    r"^appVersion:\s*[\"']?([^\"'\s]+)", (ROOT / "helm" / "hami" / "Chart.yaml").read_text(), re.M
)[1]
LOCAL_REGISTRY = "localhost"
BASE_IMAGE = "docker.io/library/debian:bookworm-slim"
SUITE = "bookworm"
MIRROR = os.environ.get("DEBIAN_MIRROR", "http://deb.debian.org/debian")
# The official image's sources (debian:bookworm-slim ships this deb822 file).
DEBIAN_SOURCES = f"""\
Types: deb
URIs: {MIRROR}
Suites: {SUITE} {SUITE}-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: {MIRROR.replace("/debian", "/debian-security")}
Suites: {SUITE}-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
"""
# Local images only: the base we commit and the stages we build; a pull would be refused.
POLICY = {
    "default": [{"type": "reject"}],
    "transports": {"containers-storage": {"": [{"type": "insecureAcceptAnything"}]}},
}


@dataclass(frozen=True)
class Image:
    """One image of images/: its directory `name`, the repository the chart pulls it from (values.yaml's
    scheduler.extender.image / devicePlugin.image) and the commands it must run."""

    name: str
    repository: str
    entry_points: tuple[tuple[str, ...], ...]

    @property
    def dockerfile(self) -> Path:
        return ROOT / "images" / self.name / "Dockerfile"

    def reference(self, registry: str = LOCAL_REGISTRY, tag: str = APP_VERSION) -> str:
        """``<registry>/<repository>:<tag>``, the image as the chart names it for that registry and tag."""
        return f"{registry.rstrip('/')}/{self.repository}:{tag}"


IMAGES = (
    Image("hami", "hami-legacy/hami",
          (("hami-scheduler-extender", "--help"), ("hami-webhook", "--help"), ("hami", "--help"),
           ("kubectl-hami", "--help"), ("hami-certgen", "--help"))),
    Image("device-plugin", "hami-legacy/hami-device-plugin",
          (("hami-device-plugin", "--help"), ("hami-vgpu-monitor", "--help"))),
)  # fmt: skip


class BuildError(RuntimeError):
    """A step failed: the message names the step and ends with its output."""


@dataclass(frozen=True)
class Container:
    """A working container: `root` is its mounted file system (read it, never write it)."""

    builder: Builder
    name: str
    root: Path

    def run(self, *command: str, timeout: float = 300) -> subprocess.CompletedProcess:
        """`command` in the container as the image runs it (its USER, PATH and working directory)."""
        return self.builder.buildah("run", "--isolation", "chroot", self.name, "--", *command, check=False,
                                    timeout=timeout)  # fmt: skip

    def read(self, path: str) -> bytes | None:
        """The bytes of the absolute `path` in the container; None when it is not a regular file."""
        f = self.root / path.lstrip("/")
        return f.read_bytes() if f.is_file() and not f.is_symlink() else None


class Builder:
    """buildah with every path under `workdir` (storage, run directory, policy, the base tarball); the
    images are named `image.reference(registry, tag)`."""

    def __init__(
        self, workdir: Path, *, registry: str = LOCAL_REGISTRY, tag: str = APP_VERSION, log=print
    ) -> None:
        self.workdir = workdir.resolve()
        self.registry = registry
        self.tag = tag
        self.log = log
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.policy = self.workdir / "policy.json"
        self.policy.write_text(json.dumps(POLICY))

    def ref(self, image: Image) -> str:
        return image.reference(self.registry, self.tag)

    # -- buildah --------------------------------------------------------------------------------
    def buildah(self, *args: str, check: bool = True, timeout: float = 1200) -> subprocess.CompletedProcess:
        cmd = ["buildah", "--root", str(self.workdir / "storage"), "--runroot", str(self.workdir / "run"),
               "--storage-driver", "vfs", *args]  # fmt: skip
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
        if check and r.returncode != 0:
            raise BuildError(f"{' '.join(cmd[7:9])} failed ({r.returncode}):\n{_tail(r.stdout + r.stderr)}")
        return r

    # -- the base -------------------------------------------------------------------------------
    def base_tarball(self) -> Path:
        """build/images/base-bookworm-<arch>.tar: a debootstrapped minbase root, made once."""
        arch = subprocess.run(["dpkg", "--print-architecture"], capture_output=True, text=True,
                              check=True).stdout.strip()  # fmt: skip
        tarball = self.workdir / f"base-{SUITE}-{arch}.tar"
        if tarball.exists():
            return tarball
        self.log(f"debootstrap --variant=minbase {SUITE} ({MIRROR}) ...")
        with tempfile.TemporaryDirectory(dir=self.workdir) as tmp:
            rootfs = Path(tmp) / "rootfs"
            # A private mount namespace: debootstrap mounts /proc and /sys inside the target, and
            # nothing of that may reach the host's mount table.
            r = subprocess.run(
                ["unshare", "--mount", "--propagation", "private", "debootstrap", "--variant=minbase",
                 f"--arch={arch}", SUITE, str(rootfs), MIRROR],
                capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=1200,
            )  # fmt: skip
            if r.returncode != 0:
                raise BuildError(f"debootstrap failed ({r.returncode}):\n{_tail(r.stdout + r.stderr)}")
            (rootfs / "etc/apt/sources.list").unlink(missing_ok=True)
            (rootfs / "etc/apt/sources.list.d/debian.sources").write_text(DEBIAN_SOURCES)
            shutil.rmtree(rootfs / "var/lib/apt/lists", ignore_errors=True)
            (rootfs / "var/lib/apt/lists/partial").mkdir(parents=True)
            shutil.rmtree(rootfs / "var/cache/apt/archives", ignore_errors=True)
            (rootfs / "var/cache/apt/archives/partial").mkdir(parents=True)
            partial = tarball.with_suffix(".tar.partial")
            subprocess.run(
                ["tar", "--numeric-owner", "-C", str(rootfs), "-cf", str(partial), "."], check=True
            )
            partial.rename(tarball)
        return tarball

    def commit_base(self) -> None:
        """The debootstrapped root as BASE_IMAGE in our storage, configured like the official image."""
        tarball = self.base_tarball()
        if self.buildah("inspect", "--type", "image", BASE_IMAGE, check=False).returncode == 0:
            return
        ctr = self.buildah("from", "--signature-policy", str(self.policy), "scratch").stdout.strip()
        try:
            self.buildah("add", ctr, str(tarball), "/")
            self.buildah("config", "--env", "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                         "--cmd", "bash", ctr)  # fmt: skip
            self.buildah("commit", "--signature-policy", str(self.policy), ctr, BASE_IMAGE)
        finally:
            self.buildah("rm", ctr, check=False)

    # -- the images -----------------------------------------------------------------------------
    def build(self, image: Image) -> None:
        """`buildah bud` of image.dockerfile with the repository root as context, named `ref(image)`."""
        self.commit_base()
        self.log(f"buildah bud -f {image.dockerfile.relative_to(ROOT)} ...")
        self.buildah(
            "bud", "--signature-policy", str(self.policy), "--isolation", "chroot", "--pull=never",
            "--network", "host", *self._ca_mounts(), "-f", str(image.dockerfile), "-t", self.ref(image), str(ROOT),
            timeout=1800,
        )  # fmt: skip

    @contextlib.contextmanager
    def container(self, image: Image) -> Iterator[Container]:
        """A container of the built image, removed afterwards; with vfs storage each one is a full copy of the
        image, so a caller runs all its commands and reads all its files in one."""
        ctr = self.buildah(
            "from", "--signature-policy", str(self.policy), "--pull=never", self.ref(image)
        ).stdout.strip()
        try:
            yield Container(self, ctr, Path(self.buildah("mount", ctr).stdout.strip()))
        finally:
            self.buildah("umount", ctr, check=False)
            self.buildah("rm", ctr, check=False)

    def inspect(self, image: Image) -> dict:
        """buildah's view of the built image (OCIv1.config: Labels, User, Env, Cmd)."""
        return json.loads(self.buildah("inspect", "--type", "image", self.ref(image)).stdout)

    def push(self, image: Image) -> None:
        """`buildah push` of the built image to its registry (credentials from `buildah login`)."""
        ref = self.ref(image)
        self.log(f"buildah push {ref} ...")
        self.buildah("push", "--signature-policy", str(self.policy), ref, f"docker://{ref}", timeout=1800)

    def remove_storage(self) -> None:
        """Everything but the base tarball (vfs storage holds a full copy of every layer)."""
        self.buildah("rm", "--all", check=False)
        self.buildah("rmi", "--all", "--force", check=False)
        for d in ("storage", "run"):
            shutil.rmtree(self.workdir / d, ignore_errors=True)

    def _ca_mounts(self) -> list[str]:
        ca = Path(os.environ.get("SSL_CERT_FILE") or "/etc/ssl/certs/ca-certificates.crt")
        if not ca.is_file():
            return []
        conf = self.workdir / "pip.conf"
        conf.write_text("[global]\ncert = /etc/hami-build-ca.crt\n")
        return ["--volume", f"{ca}:/etc/hami-build-ca.crt:ro", "--volume", f"{conf}:/etc/pip.conf:ro"]


def missing_tools() -> list[str]:
    """What this host lacks to build: root, debootstrap, buildah, unshare."""
    out = [t for t in ("debootstrap", "buildah", "unshare", "dpkg") if not shutil.which(t)]
    if os.geteuid() != 0:
        out.append("root (buildah --isolation chroot and debootstrap need it)")
    return out


def _tail(text: str, lines: int = 60) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workdir", type=Path, default=ROOT / "build" / "images",
                   help="buildah storage and the cached base (default: build/images)")  # fmt: skip
    p.add_argument("--image", choices=[i.name for i in IMAGES], action="append",
                   help="build only this image (repeatable; default: both)")  # fmt: skip
    p.add_argument("--run-help", action="store_true", help="run each entry point's --help in the image")
    p.add_argument("--registry", default=LOCAL_REGISTRY,
                   help="registry the images are named for, e.g. registry.example.com (default: localhost)")  # fmt: skip
    p.add_argument("--tag", default=APP_VERSION, help=f"image tag (default: the chart's appVersion, {APP_VERSION})")  # fmt: skip
    p.add_argument("--push", action="store_true", help="push each image to --registry after it is built")
    p.add_argument("--clean", action="store_true", help="remove buildah's storage afterwards")
    args = p.parse_args(argv)
    if args.push and args.registry.rstrip("/") == LOCAL_REGISTRY:
        print("build_images: --push needs --registry (the registry the nodes pull from, e.g. "
              "registry.example.com); localhost/ names exist only in this build's storage", file=sys.stderr)  # fmt: skip
        return 2
    if missing := missing_tools():
        print(f"build_images: missing {', '.join(missing)}", file=sys.stderr)
        return 2
    b = Builder(args.workdir, registry=args.registry, tag=args.tag)
    try:
        for image in [i for i in IMAGES if not args.image or i.name in args.image]:
            b.build(image)
            print(f"built {b.ref(image)}")
            if args.run_help:
                with b.container(image) as ctr:
                    for command in image.entry_points:
                        r = ctr.run(*command)
                        print(f"  {' '.join(command)}: exit {r.returncode}")
                        if r.returncode != 0:
                            print(_tail(r.stdout + r.stderr, 20), file=sys.stderr)
                            return 1
            if args.push:
                b.push(image)
                print(f"pushed {b.ref(image)}")
    except BuildError as e:
        print(f"build_images: {e}", file=sys.stderr)
        return 1
    finally:
        if args.clean:
            b.remove_storage()
    return 0


if __name__ == "__main__":
    sys.exit(main())
