"""HAMi's reason words: why a card (or a node) cannot take a container.

The words are HAMi's (hami-legacy-spec §2.5, and pkg/device/common for the vendors' own fits), so the
scheduler's failure text (``"1/4 CardInsufficientMemory, 3/4 CardTimeSlicingExhausted"``) reads as
HAMi's. A module of its own, below everything that names a reason: the vendors' fits
(`hami.vendors`), the per-card checks (`hami.card_checks`), the fit (`hami.fit`) and the sentences
that explain the words (`hami.reasons`).
"""

from __future__ import annotations

from enum import StrEnum


class Reason(StrEnum):
    """Why a card (or node) cannot take a container; values are HAMi's reason words."""

    CARD_NOT_HEALTH = "CardNotHealth"
    CARD_CORDONED = "CardCordoned"
    CARD_TYPE_MISMATCH = "CardTypeMismatch"
    NUMA_NOT_FIT = "NumaNotFit"
    CARD_UUID_MISMATCH = "CardUuidMismatch"
    CARD_TIME_SLICING_EXHAUSTED = "CardTimeSlicingExhausted"
    EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT = "ExclusiveDeviceAllocateConflict"
    RESOURCE_QUOTA_NOT_FIT = "ResourceQuotaNotFit"
    CARD_INSUFFICIENT_MEMORY = "CardInsufficientMemory"
    CARD_INSUFFICIENT_CORE = "CardInsufficientCore"
    CARD_COMPUTE_UNITS_EXHAUSTED = "CardComputeUnitsExhausted"
    CARD_MIG_TOPOLOGY_INFEASIBLE = "CardMigTopologyInfeasible"
    ALLOCATED_CARDS_INSUFFICIENT_REQUEST = "AllocatedCardsInsufficientRequest"
    NODE_INSUFFICIENT_DEVICE = "NodeInsufficientDevice"
    # Reasons of vendors' own fits (hami/vendors/, HAMi pkg/device/common reason words).
    CARD_NOT_FOUND_CUSTOM_FILTER_RULE = "CardNotFoundCustomFilterRule"
    MODE_NOT_FIT = "ModeNotFit"
    CARD_UNHEALTHY = "CardUnhealthy"
    CARD_APP_CLASS_MISMATCH = "CardAppClassMismatch"
    CARD_QOS_POLICY_MISMATCH = "CardQosPolicyMismatch"
