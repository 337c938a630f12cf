"""The files the device plugin mounts beside libvgpu so that every process of a container is
limited, whatever its environment, and so that the containers of one card share it fairly.

- ``vgpu.config`` (read-only, mounted at ``<hook>/vgpu/vgpu.config`` beside ``libvgpu.so``, the
  library ``/etc/ld.so.preload`` names): the facts of the environment Allocate sets (memory limit
  per device, SM share, cache path, card-region directory), the container's priority and the
  control switch, one ``NAME=VALUE`` line each after a ``vgpu-config 1`` header. Where the file
  exists libvgpu takes every name it may carry from the file alone (the environment is the
  tenant's and may only lower a process's memory limit), so the switch and the priority are
  always written, never left to libvgpu's defaults; a process started with ``env -i`` (sshd,
  cron, a supervisor that scrubs its children) stays limited too. Format version 1 (names an
  older libvgpu does not know are skipped by it); libvgpu fails closed (memory 0, compute 1 %) on
  a file it cannot read exactly (libvgpu/src/config.c; docs/libvgpu.md).
- ``cards/<UUID>.card`` (read-write, node-wide, one per card): the per-card shared region
  (layout libvgpu/include/vgpu_card.h). Created empty here; libvgpu sizes and formats it. It
  lives outside the per-container directories, so it survives containers and is shared by all
  tenants of the card.
"""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from hami.errors import InvalidRequest

#: Header line of format version 1 (``vgpu-config <major>``).
FORMAT_MAJOR = 1
HEADER = f"vgpu-config {FORMAT_MAJOR}"
#: File name beside libvgpu.so in the container (libvgpu looks in its own directory).
CONFIG_NAME = "vgpu.config"
#: Directory (under ``<hook>/vgpu``) of the node-wide per-card regions.
CARDS_DIR = "cards"
#: Environment variable naming the card-region directory (also written into the file).
ENV_CARD_DIR = "LIBVGPU_CARD_DIR"
ENV_TASK_PRIORITY = "CUDA_TASK_PRIORITY"
ENV_DISABLE_CONTROL = "CUDA_DISABLE_CONTROL"
#: Written when the container's facts do not say otherwise: libvgpu reads these from the file alone
#: where it exists, so the file states them (enforcement on, low priority) rather than leaving them
#: to libvgpu's defaults.
EXPLICIT_DEFAULTS = {ENV_DISABLE_CONTROL: "false", ENV_TASK_PRIORITY: "1"}
#: The largest file libvgpu reads, bytes.
MAX_BYTES = 65536

_NAMES = re.compile(
    r"CUDA_DEVICE_MEMORY_LIMIT(_[0-9]{1,2})?|CUDA_DEVICE_SM_LIMIT(_[0-9]{1,2})?|CUDA_DEVICE_MEMORY_SHARED_CACHE"
    r"|CUDA_TASK_PRIORITY|GPU_CORE_UTILIZATION_POLICY|LIBVGPU_CARD_DIR|LIBVGPU_SM_USE_IDLE|LIBVGPU_PRIORITY_FLOOR"
    r"|CUDA_DISABLE_CONTROL|LIBVGPU_SM_SLICE_MS|LIBVGPU_DEVICE_UUID_[0-9]{1,2}"
)
#: ``LIBVGPU_DEVICE_UUID_<i>``: the card of container index ``i`` (the ``<i>`` of
#: ``CUDA_DEVICE_MEMORY_LIMIT_<i>``), so that libvgpu finds a card's limit by its UUID, not by an
#: index that ``CUDA_VISIBLE_DEVICES``, ``CUDA_DEVICE_ORDER`` or the node's PCI order can shift.
ENV_DEVICE_UUID = "LIBVGPU_DEVICE_UUID_{i}"


class ConfigFileError(InvalidRequest):
    """A vgpu.config text libvgpu would refuse; the message names the line and the rule."""


def is_config_name(name: str) -> bool:
    """Whether libvgpu reads `name` from the file (the names of the environment contract)."""
    return _NAMES.fullmatch(name) is not None


def render(envs: Mapping[str, str], *, priority: str | None = None, uuids: Sequence[str] = ()) -> str:
    """The file's text for a container whose Allocate environment is `envs`.

    Only the names of the libvgpu contract are written (``NVIDIA_VISIBLE_DEVICES`` and the like
    are the runtime's, not libvgpu's); `priority` is the container's ``CUDA_TASK_PRIORITY`` when
    it sets one; `uuids` are the container's cards in index order (``LIBVGPU_DEVICE_UUID_<i>``). ``CUDA_DISABLE_CONTROL`` and ``CUDA_TASK_PRIORITY`` are always written
    (EXPLICIT_DEFAULTS where neither `envs` nor `priority` gives them). Raises ConfigFileError
    when a value cannot be written as one line or when the result would lack a memory limit or
    the cache path (libvgpu refuses such a file).
    """
    facts = EXPLICIT_DEFAULTS | {k: str(v) for k, v in envs.items() if is_config_name(k)}
    if priority is not None:
        facts[ENV_TASK_PRIORITY] = str(priority)
    for i, uuid in enumerate(uuids):
        facts[ENV_DEVICE_UUID.format(i=i)] = uuid
    lines = ["# written by the HAMi device plugin at Allocate; read by libvgpu (read-only)", HEADER]
    for name in sorted(facts):
        value = facts[name]
        if any(c in value for c in "\n\r\0") or len(value) >= 512:
            raise ConfigFileError(f"{CONFIG_NAME}: {name}: value {value!r} is not one line under 512 bytes")
        lines.append(f"{name}={value}")
    text = "\n".join(lines) + "\n"
    parse(text)  # the same rules libvgpu applies: never mount a file it would refuse
    return text


def parse(text: str) -> dict[str, str]:
    """Reads a vgpu.config text by libvgpu's rules; returns {name: value} (last one wins).

    Raises ConfigFileError naming the line: missing or other-version header, a line without
    ``=``, a bad name, a value of 512 bytes or more, a NUL byte, over MAX_BYTES in all, or no
    memory limit / no absolute cache path. Unknown well-formed names are skipped (a newer
    plugin's facts), as libvgpu does.
    """
    if len(text.encode()) > MAX_BYTES:
        raise ConfigFileError(f"{CONFIG_NAME}: larger than {MAX_BYTES} bytes")
    facts: dict[str, str] = {}
    seen_header = False
    for no, raw in enumerate(text.split("\n"), start=1):
        line = raw[:-1] if raw.endswith("\r") else raw
        if "\0" in line:
            raise ConfigFileError(f"{CONFIG_NAME}: line {no} holds a NUL byte")
        if not line or line.startswith("#"):
            continue
        if not seen_header:
            # ASCII digits only: Python's \d also takes "١" or "５", which libvgpu refuses
            m = re.fullmatch(r"vgpu-config ([0-9]+)", line)
            if not m:
                raise ConfigFileError(f"{CONFIG_NAME}: line {no}: expected {HEADER!r}")
            if int(m.group(1)) != FORMAT_MAJOR:
                raise ConfigFileError(
                    f"{CONFIG_NAME}: format version {m.group(1)}, libvgpu reads {FORMAT_MAJOR}"
                )
            seen_header = True
            continue
        name, eq, value = line.partition("=")
        if not eq:
            raise ConfigFileError(f"{CONFIG_NAME}: line {no}: expected NAME=VALUE")
        if not re.fullmatch(r"[A-Z0-9_]{1,63}", name) or len(value.encode()) >= 512:
            raise ConfigFileError(f"{CONFIG_NAME}: line {no}: bad name or value too long")
        if is_config_name(name):
            facts[name] = value
    if not seen_header:
        raise ConfigFileError(f"{CONFIG_NAME}: no {HEADER!r} header")
    if not any(k.startswith("CUDA_DEVICE_MEMORY_LIMIT") for k in facts):
        raise ConfigFileError(f"{CONFIG_NAME}: no CUDA_DEVICE_MEMORY_LIMIT")
    if not facts.get("CUDA_DEVICE_MEMORY_SHARED_CACHE", "").startswith("/"):
        raise ConfigFileError(
            f"{CONFIG_NAME}: CUDA_DEVICE_MEMORY_SHARED_CACHE missing or not an absolute path"
        )
    return facts


def container_priority(container: Mapping) -> str | None:
    """The container's own ``CUDA_TASK_PRIORITY`` (set by the webhook from ``nvidia.com/priority``),
    read by value from the pod spec (last entry wins); None when unset."""
    value = None
    for env in container.get("env") or []:
        if isinstance(env, Mapping) and env.get("name") == ENV_TASK_PRIORITY and "value" in env:
            value = str(env["value"])
    return value


@dataclass(frozen=True)
class MountSpec:
    """One extra mount for the container: paths on the host and in the container."""

    container_path: str
    host_path: str
    read_only: bool


def card_dir(vgpu_dir: Path) -> Path:
    """``<hook>/vgpu/cards``: the card regions, on the host and (same path) in the container."""
    return Path(vgpu_dir) / CARDS_DIR


def prepare(vgpu_dir: Path, cache_dir: Path, envs: Mapping[str, str], cards: Sequence[str],
            container: Mapping) -> list[MountSpec]:  # fmt: skip
    """Writes the container's vgpu.config into its host directory `cache_dir` and makes sure each
    card of `cards` (UUIDs) has its node-wide region file; returns the mounts to add.

    `envs` must already hold ``LIBVGPU_CARD_DIR`` when card regions are wanted (the allocator
    sets it). Raises OSError when the host files cannot be written, ConfigFileError when the
    environment cannot be expressed as a file libvgpu accepts.
    """
    text = render(envs, priority=container_priority(container), uuids=cards)
    host_cfg = Path(cache_dir) / CONFIG_NAME
    # The directory is the container's, writable from inside it, and kept when the container is
    # served again after a reboot: a fixed temporary name there could be the tenant's link to a host
    # file. mkstemp creates a new file (O_EXCL, never through a link); the rename replaces a link
    # named vgpu.config itself, not its target.
    fd, tmp = tempfile.mkstemp(dir=cache_dir, prefix=f".{CONFIG_NAME}.")
    try:
        with os.fdopen(fd, "w") as f:
            os.fchmod(f.fileno(), 0o444)
            f.write(text)
        os.replace(tmp, host_cfg)  # a reader never sees half a file
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    mounts = [MountSpec(str(Path(vgpu_dir) / CONFIG_NAME), str(host_cfg), True)]
    cdir = card_dir(vgpu_dir)
    cdir.mkdir(parents=True, exist_ok=True)
    for uuid in dict.fromkeys(cards):
        if not re.fullmatch(r"[A-Za-z0-9-]{1,95}", uuid):
            raise ConfigFileError(f"card UUID {uuid!r} is not usable as a file name")
        card = cdir / f"{uuid}.card"
        fd = os.open(card, os.O_RDWR | os.O_CREAT, 0o666)  # never truncated: tenants' state lives in it
        os.close(fd)
        os.chmod(card, 0o666)  # noqa: S103 - every container user on the card maps it read-write
        mounts.append(MountSpec(str(card), str(card), False))
    return mounts
