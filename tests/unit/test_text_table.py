"""hami.tools.table: the one printer of the tools' and the simulator's text tables."""

from __future__ import annotations

from hami.tools.table import Style, table, visible_len


def test_left_columns_by_index_the_rest_right_under_a_rule() -> None:
    rows = [["binpack", "3", "ok"], ["spread", "12", "CardInsufficientMemory"]]
    assert table(["policy", "n", "why"], rows, left=(0, -1), rule=True) == [
        "policy    n  why",
        "-------  --  ----------------------",
        "binpack   3  ok",
        "spread   12  CardInsufficientMemory",
    ]


def test_every_column_left_by_default_trailing_blanks_stripped_and_indent() -> None:
    assert table(["A", "B"], [["xx", ""], ["", "y"]], indent="  ") == ["  A   B", "  xx", "      y"]
    assert table(["only", "header"], []) == ["only  header"]


def test_colour_codes_take_no_width_only_with_a_style() -> None:
    on = Style(True)
    cell = on.bad("no")
    assert visible_len(cell) == 2 and len(cell) > 2
    # with a style the coloured cell pads as two characters and the header is bold
    assert table(["X", "Y"], [[cell, "1"]], style=on) == ["\x1b[1mX   Y\x1b[0m", f"{cell}  1"]
    assert table(["X", "Y"], [[cell, "1"]], style=Style(False)) == ["X   Y", f"{cell}  1"]
    # without one every character counts (the simulator's tables carry no colour)
    assert table(["X", "Y"], [[cell, "1"]])[0] == "X" + " " * (len(cell) - 1) + "  Y"
