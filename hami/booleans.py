"""One reading of boolean environment values for every component (extender, device plugin, libvgpu).

The rule, kept row by row in ``libvgpu/include/vgpu_bool_table.txt`` (tests check this module and
libvgpu's C header against that file):

- true:  ``1``, ``t``, ``true``, ``y``, ``yes``, ``on``  (any letter case)
- false: ``0``, ``f``, ``false``, ``n``, ``no``, ``off``, the empty string (any letter case)
- anything else is invalid, white space included (``" true"``): the container runtime hands the
  bytes over unchanged, so trimming in one reader and not in another would make them disagree.

Why a wider set than Go's ``strconv.ParseBool``: HAMi-core (C) reads ``yes``/``on`` as true while
HAMi's Go components read them as false, so a container with ``CUDA_DISABLE_CONTROL=yes`` ran
unlimited on a card the scheduler had shared. One table removes the disagreement.
"""

from __future__ import annotations

from hami.errors import InvalidRequest

__all__ = ["TRUE_WORDS", "FALSE_WORDS", "parse_bool", "bool_or_default"]

#: Lower-case values read as true.
TRUE_WORDS = frozenset({"1", "t", "true", "y", "yes", "on"})
#: Lower-case values read as false (the empty string: a variable set to nothing).
FALSE_WORDS = frozenset({"0", "f", "false", "n", "no", "off", ""})
_VALID = "1, t, true, y, yes, on (true); 0, f, false, n, no, off, empty (false); any letter case"


def parse_bool(value: str, *, field: str) -> bool:
    """Reads `value` by the shared truth table.

    `field` names the variable or annotation for the error message.
    Raises `hami.errors.InvalidRequest` (a `ValueError`) naming `field` and the valid values when
    the value is not in the table (white space is not trimmed).
    """
    if not isinstance(value, str):
        raise InvalidRequest(f"{field}: {value!r} is not a boolean; valid: {_VALID}")
    v = value.lower()
    if v in TRUE_WORDS:
        return True
    if v in FALSE_WORDS:
        return False
    raise InvalidRequest(f"{field}: {value!r} is not a boolean; valid: {_VALID}")


def bool_or_default(value: str | None, *, field: str, default: bool) -> bool:
    """Like `parse_bool`, but an unset (None) or invalid value reads as `default`.

    For switches whose safe reading is known, e.g. ``CUDA_DISABLE_CONTROL`` (default False:
    enforcement stays on), which libvgpu reads the same way (it also logs the invalid value).
    """
    if value is None:
        return default
    try:
        return parse_bool(value, field=field)
    except InvalidRequest:
        return default
