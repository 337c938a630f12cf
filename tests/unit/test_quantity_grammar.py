"""Why `hami.quantity` keeps its own parser: inputs the official client's `parse_quantity` accepts but
the API server's quantity grammar refuses are refused here, with the resource named."""

from __future__ import annotations

import pytest
from kubernetes.utils import parse_quantity as client_parse_quantity

from hami.errors import InvalidRequest
from hami.quantity import parse_quantity, to_mib

LAX = ["NaN", "Infinity", "1_000", "\u0661\u0660", "1e3k", "1e999999999"]


@pytest.mark.parametrize(
    "value", LAX, ids=["nan", "infinity", "underscore", "arabic-digits", "exp-and-suffix", "huge-exp"]
)
def test_the_client_parser_accepts_what_the_grammar_refuses(value: str) -> None:
    client_parse_quantity(value)  # no error: the reason ours stays
    with pytest.raises(InvalidRequest) as e:
        parse_quantity(value, resource="nvidia.com/gpumem")
    assert str(e.value).startswith("nvidia.com/gpumem: ")


def test_canonical_forms_agree_with_the_client_where_both_accept() -> None:
    for value, mib in (("20k", 20000), ("16Gi", 16384), ("2e3", 2000), ("512Mi", 512)):
        assert to_mib(value, resource="nvidia.com/gpumem") == mib
        assert client_parse_quantity(value) in (mib, mib * 2**20)
