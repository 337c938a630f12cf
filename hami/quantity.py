"""Kubernetes resource quantities turned into the integers HAMi works in: counts, MiB and percent.

HAMi reads `nvidia.com/gpumem: 16Gi` with `AsInt64` and gets 17179869184 "MiB", which overflows its
int32 and silently drops the whole request (hami-legacy-spec §1.1). Here a quantity with a binary unit
(Ki, Mi, Gi, ...) is bytes and is converted to MiB exactly; a bare number is already MiB, and so is a
number with a ``k`` suffix or exponent: the API server stores quantities in canonical form, so the
`gpumem: 20000` a user wrote reaches the scheduler as ``20k`` (and a quota of 24000 as ``24k``), which
must stay 20000 MiB as in HAMi (see `to_mib` for M and larger). Everything that is not a whole,
non-negative number in range is an `InvalidRequest` naming the resource.
Quantity grammar and canonical form: k8s.io/apimachinery/pkg/api/resource (decimal SI, binary SI and
exponent suffixes; "the exponent (or suffix) is as large as possible").

Why not `kubernetes.utils.parse_quantity`: the official client's parser hands the number to Python's
`Decimal`, so it accepts what the API server's grammar refuses and what a pod owner could use to slip
past a limit: ``NaN``, ``Infinity``, ``1_000``, non-ASCII digits (``١٠``), a suffix after an exponent
(``1e3k``) and exponents of any size (``1e999999999``). It also cannot say whether a unit was written, which the
MiB rules below need (``20k`` is the 20000 MiB a user wrote; ``1000M`` per card is bytes). And the
pure core may not import `kubernetes` (the import contracts keep the client behind `hami.kube`). So
this module keeps its own grammar, the API server's, exactly.
"""

from __future__ import annotations

import re
from fractions import Fraction

from hami.errors import InvalidRequest

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 10**3),
    "": Fraction(1),
    "k": Fraction(10**3),
    "M": Fraction(10**6),
    "G": Fraction(10**9),
    "T": Fraction(10**12),
    "P": Fraction(10**15),
    "E": Fraction(10**18),
}
#: ASCII digits only, as Kubernetes' quantity grammar (Python's \d also takes "١" or "５").
_QUANTITY = re.compile(r"^([+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+))(Ki|Mi|Gi|Ti|Pi|Ei|[eE][+-]?[0-9]+|[numkMGTPE])?$")
#: Largest value HAMi stores (int32); beyond it HAMi wraps, we refuse.
INT32_MAX = 2**31 - 1
MIB = 2**20
_MAX_EXPONENT = 30


def parse_quantity(value: object, *, resource: str) -> tuple[Fraction, bool]:
    """Parse a quantity string (or int) into (exact value, has_unit).

    `has_unit` is True when a binary/decimal SI suffix or exponent was given. Raises InvalidRequest
    naming `resource` for anything the Kubernetes grammar does not accept.
    """
    if isinstance(value, bool):
        raise InvalidRequest(f"{resource}: {value!r} is not a quantity")
    if isinstance(value, int):
        return Fraction(value), False
    if isinstance(value, float):
        return Fraction(str(value)), False
    if not isinstance(value, str):
        raise InvalidRequest(f"{resource}: {value!r} is not a quantity")
    m = _QUANTITY.match(value.strip())
    if not m:
        raise InvalidRequest(
            f"{resource}: {value!r} is not a Kubernetes quantity (a number with an optional suffix "
            "Ki, Mi, Gi, Ti, Pi, Ei, n, u, m, k, M, G, T, P, E or an exponent)"
        )
    number, suffix = Fraction(m.group(1)), m.group(2) or ""
    if suffix in _BINARY:
        return number * _BINARY[suffix], True
    if suffix in _DECIMAL:
        return number * _DECIMAL[suffix], suffix not in ("", "m", "u", "n")
    exponent = int(suffix[1:])
    if abs(exponent) > _MAX_EXPONENT:
        # Kubernetes caps quantities at 2^63-1; a huge exponent must not make us compute 10**1e9.
        raise InvalidRequest(f"{resource}: {value!r} is out of range (exponent beyond +-{_MAX_EXPONENT})")
    return number * Fraction(10) ** exponent, True


def _whole(v: Fraction, *, resource: str, raw: object, unit: str) -> int:
    if v < 0:
        raise InvalidRequest(f"{resource}: {raw!r} is negative; it must be a whole number of {unit} >= 0")
    if v.denominator != 1:
        raise InvalidRequest(f"{resource}: {raw!r} is not a whole number of {unit}")
    if v > INT32_MAX:
        raise InvalidRequest(f"{resource}: {raw!r} is larger than {INT32_MAX} {unit}")
    return int(v)


def to_count(value: object, *, resource: str, unit: str = "devices") -> int:
    """A whole number >= 0 of `unit` (a device count such as `nvidia.com/gpu: 2`, or a count of another
    unit the message names: percent, 512 MiB units, ...). Raises InvalidRequest."""
    v, _ = parse_quantity(value, resource=resource)
    return _whole(v, resource=resource, raw=value, unit=unit)


def to_mib(value: object, *, resource: str, unit_mib: int = 1, per_card: bool = False) -> int:
    """Device memory in MiB.

    A bare number is a count of `unit_mib` MiB (HAMi: MiB for NVIDIA, 256 MiB for Cambricon), and so is
    a number with a ``k`` suffix or an exponent (Kubernetes' canonical form: ``20k`` is the 20000 a user
    wrote). A binary unit (``16Gi`` -> 16384) means bytes and must be a whole number of MiB. A decimal
    ``M``/``G``/``T``/``P``/``E`` suffix is a count of MiB for totals (a quota of 2000000 arrives as
    ``2M``) but bytes for a per-card request (`per_card`; 10^6 MiB is beyond any card, so the user meant
    bytes: ``1000M`` is 953.674 MiB, an error). Never a silent 0 or a wrap.
    Raises InvalidRequest naming `resource`.
    """
    v, _ = parse_quantity(value, resource=resource)
    text = value.strip() if isinstance(value, str) else ""
    if text.endswith(tuple(_BINARY)) or (per_card and text[-1:] in ("M", "G", "T", "P", "E")):
        mib = v / MIB
        if mib.denominator != 1 and v >= 0:
            raise InvalidRequest(
                f"{resource}: {value!r} is {float(mib):.3f} MiB, not a whole number of MiB; "
                "write MiB as a bare number (e.g. 16384) or use Mi/Gi units"
            )
        return _whole(mib, resource=resource, raw=value, unit="MiB")
    return _whole(v * unit_mib, resource=resource, raw=value, unit="MiB")


def to_percent(value: object, *, resource: str, low: int = 0, high: int = 100) -> int:
    """A percentage (gpucores, gpumem-percentage): a whole number in `low`..`high`. Raises InvalidRequest."""
    v, has_unit = parse_quantity(value, resource=resource)
    if has_unit:
        raise InvalidRequest(
            f"{resource}: {value!r} must be a plain percentage {low}..{high}, without a unit"
        )
    n = _whole(v, resource=resource, raw=value, unit="percent")
    if not low <= n <= high:
        raise InvalidRequest(f"{resource}: {value!r} is outside the valid range {low}..{high}")
    return n
