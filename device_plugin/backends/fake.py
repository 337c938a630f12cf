"""A backend whose cards come from a YAML file: for tests and for trying the plugin without a GPU.

File format (``--fake-config CARDS.yaml``)::

    cards:
      - {uuid: GPU-aaaa, index: 0, model: Tesla V100-PCIE-32GB, memory_mib: 32768, numa: 0}
      - {uuid: GPU-bbbb, index: 1, model: NVIDIA A100-SXM4-80GB, memory_mib: 81920, numa: 1, healthy: false}

`healthy` is optional (default true). The file is re-read while the plugin runs: changing a card's
`healthy` there is how tests (and curious users) make a card fail or recover; adding or removing cards
needs a restart, as with real hardware.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import yaml

from device_plugin.backends.base import BackendOptions, HealthReport
from device_plugin.devices import Card, nvidia_type
from hami.errors import ConfigError

log = logging.getLogger(__name__)

_KEYS = {"uuid", "index", "model", "memory_mib", "numa", "healthy"}


def parse_cards(data: Any, *, source: str = "fake config") -> list[Card]:
    """Validate a parsed ``cards:`` document; raises ConfigError naming the card and the field."""
    if not isinstance(data, dict) or not isinstance(data.get("cards"), list):
        raise ConfigError(f"{source}: want a mapping with a 'cards:' list of {{{', '.join(sorted(_KEYS))}}}")
    cards: list[Card] = []
    for i, raw in enumerate(data["cards"]):
        where = f"{source}: cards[{i}]"
        if not isinstance(raw, dict):
            raise ConfigError(f"{where}: must be a mapping")
        unknown = set(raw) - _KEYS
        if unknown:
            raise ConfigError(f"{where}: unknown key(s) {sorted(unknown)}; valid: {sorted(_KEYS)}")
        for key in ("uuid", "model"):
            if not isinstance(raw.get(key), str) or not raw[key].strip():
                raise ConfigError(f"{where}.{key}: must be a non-empty string")
        for key, minimum in (("index", 0), ("memory_mib", 1)):
            val = raw.get(key, i if key == "index" else None)
            if isinstance(val, bool) or not isinstance(val, int) or val < minimum:
                raise ConfigError(f"{where}.{key}: {val!r} must be an integer >= {minimum}")
        numa = raw.get("numa")
        if numa is not None and (isinstance(numa, bool) or not isinstance(numa, int) or numa < 0):
            raise ConfigError(f"{where}.numa: {numa!r} must be an integer >= 0 or absent")
        healthy = raw.get("healthy", True)
        if not isinstance(healthy, bool):
            raise ConfigError(f"{where}.healthy: {healthy!r} must be true or false")
        cards.append(
            Card(
                uuid=raw["uuid"].strip(),
                index=raw.get("index", i),
                model=nvidia_type(raw["model"]),
                memory_mib=raw["memory_mib"],
                numa=numa,
                healthy=healthy,
            )
        )
    uuids = [c.uuid for c in cards]
    if len(set(uuids)) != len(uuids):
        raise ConfigError(f"{source}: duplicate uuid in cards: {uuids}")
    return sorted(cards, key=lambda c: c.index)


def load_cards(path: str | Path) -> list[Card]:
    """Read and validate a CARDS.yaml file. Raises ConfigError naming the file."""
    try:
        data = yaml.safe_load(Path(path).read_text())
    except OSError as e:
        raise ConfigError(f"{path}: cannot read fake cards file: {e.strerror}") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: invalid YAML: {e}") from None
    return parse_cards(data, source=str(path))


class FakeBackend:
    """Cards from a YAML file; health follows the file's `healthy` fields (polled every `poll_s` seconds)."""

    name = "fake"

    def __init__(self, path: str | Path, *, poll_s: float = 0.2) -> None:
        self.path = Path(path)
        self.poll_s = poll_s

    def discover(self) -> list[Card]:
        return load_cards(self.path)

    async def watch_health(self, report: HealthReport) -> None:
        last: dict[str, bool] = {c.uuid: c.healthy for c in self.discover()}
        stamp = self._stamp()
        while True:
            await asyncio.sleep(self.poll_s)
            now = self._stamp()
            if now == stamp:
                continue
            stamp = now
            try:
                cards = load_cards(self.path)
            except ConfigError as e:
                # A half-written file is normal while an editor saves; keep the last good state.
                log.warning("fake backend: ignoring unreadable cards file: %s", e)
                continue
            for c in cards:
                if last.get(c.uuid, True) != c.healthy:
                    report(c.uuid, c.healthy, f"{self.path}: healthy={str(c.healthy).lower()}")
                last[c.uuid] = c.healthy

    def close(self) -> None:
        pass

    def _stamp(self) -> tuple[int, int] | None:
        try:
            st = self.path.stat()
        except OSError:
            return None
        return (st.st_mtime_ns, st.st_size)


def build(options: BackendOptions) -> FakeBackend:
    """The fake backend for ``--backend fake``. Raises ConfigError when ``--fake-config`` is missing."""
    if not options.fake_config:
        raise ConfigError("--fake-config: required with --backend fake (a YAML file with a 'cards:' list)")
    return FakeBackend(options.fake_config)
