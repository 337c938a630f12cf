"""Vastai (CommonWord `Vastai`): whole cards, or dies of one card (AIC) kept together, from
`hami.io/node-va-register`.

HAMi pkg/device/vastai. Vastai's device plugin registers HAMi's JSON with `custominfo`
`{"DeviceStrategy": "die", "AIC": "<card>"}` in die mode, answers `hami.io/node-handshake-va`, and pops
the container's entry of `hami.io/Vastai-devices-to-allocate` under `hami.io/mutex.lock`. A request is
whole cards or dies (0 MiB, 0 cores in the list). Die mode (when the node's first die says so): under
the `mutex` card policy a die is free only when no die of its card is used; a request for several dies
takes whole groups of one card first (the biggest group first), so dies of one card stay together.
Nodes score, as in HAMi, the sum over containers of (most dies on one card / dies).
Difference from HAMi: groups of equal size are taken in card-name order (HAMi: Go map order, i.e. random).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hami import annotations as A
from hami.model import Device
from hami.vendors import common as C
from hami.vendors.base import group_score


@dataclass(frozen=True)
class VastaiConfig:
    """The `vastai:` section (HAMi chart `devices.vastai`, pkg/device/vastai)."""

    resourceCountName: str = "vastaitech.com/va"
    """Whole Vastai cards or dies per container. Default `vastaitech.com/va` (HAMi chart)."""

    def validate(self) -> None:
        """Nothing to check beyond the types."""


@dataclass(frozen=True, slots=True)
class VastaiDevice(Device):
    strategy: str = ""
    aic: str = ""


class VastaiVendor(C.ShareVendor):
    common_word = "Vastai"
    register_key = "hami.io/node-va-register"
    handshake_key = "hami.io/node-handshake-va"
    to_allocate_key = "hami.io/Vastai-devices-to-allocate"
    allocated_key = "hami.io/Vastai-devices-allocated"
    use_uuid_key = "vastaitech.com/use-gpuuuid"
    nouse_uuid_key = "vastaitech.com/nouse-gpuuuid"
    uses_node_lock = True
    custom_fit = True
    scores_nodes = True
    whole_card = (0, 0, 0)

    def __init__(self, config: VastaiConfig | None = None) -> None:
        self.config = config or VastaiConfig()
        super().__init__(self.config.resourceCountName)

    def node_devices(self, node: Mapping[str, Any]) -> list[Device] | None:
        value = A.pod_annotations(node).get(self.register_key)
        if value is None:
            return None
        out: list[Device] = []
        for d, custom in C.decode_register_json(value, vendor=self.common_word):
            out.append(
                VastaiDevice(
                    uuid=d.uuid,
                    index=d.index,
                    count=d.count,
                    devmem=d.devmem,
                    devcore=100,
                    type=d.type,
                    numa=d.numa,
                    mode=d.mode,
                    health=d.health,
                    vendor=d.vendor,
                    strategy=str(custom.get("DeviceStrategy") or ""),
                    aic=str(custom.get("AIC") or ""),
                )  # fmt: skip
            )
        return out

    def fit_cards(self, req, cards, usage, *, selection, policy, earlier, quota_ok):  # noqa: ANN001, ANN201
        if (short := C.fewer_cards(req, cards)) is not None:
            return short
        die = bool(cards) and getattr(cards[0], "strategy", "") == "die"
        busy_aic = {getattr(d, "aic", "") for d in cards if usage(d.uuid).used > 0} if die else set()
        passing, reasons = C.scan(
            cards,
            usage,
            selection=selection,
            mutex=policy.mutex,
            # In die mode the mutex policy also refuses a die whose AIC has a die in use.
            busy=lambda d, _: die and getattr(d, "aic", "") in busy_aic,
        )
        if len(passing) < req.nums:
            return C.insufficient(reasons, len(passing))
        ordered = [d for d, _ in C.by_policy(passing, req, policy)]
        if die and req.nums > 1 and len(ordered) > req.nums:
            groups: dict[str, list[Device]] = {}
            for d in ordered:
                groups.setdefault(getattr(d, "aic", ""), []).append(d)
            ordered = [d for _, g in sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0])) for d in g]
        return [C.take(d, req, 0, 0) for d in ordered[: req.nums]], reasons

    def node_score(self, containers, *, cards, node_policy):  # noqa: ANN001, ANN201
        """HAMi: sum over containers of (most dies on one card / dies); 0 unless every card is a die."""

        def card_of(uuid: str) -> str | None:
            d = cards.get(uuid)
            return d.aic if isinstance(d, VastaiDevice) and d.strategy == "die" and d.aic else None

        s = group_score(containers, card_of)
        return 0.0 if s is None else s


def build(config: VastaiConfig, device_config: Any) -> list[VastaiVendor]:
    return [VastaiVendor(config)]
