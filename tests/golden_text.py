"""Golden text files: a test's output compared byte for byte with the file under tests/golden/.

``UPDATE_GOLDEN=1`` writes the output instead (after a deliberate change; review the diff).
"""

from __future__ import annotations

import os
from pathlib import Path

GOLDEN = Path(__file__).resolve().parent / "golden"
UPDATE = os.environ.get("UPDATE_GOLDEN") == "1"


def check_golden(folder: str, name: str, text: str) -> None:
    """`text` equals tests/golden/`folder`/`name` (or, with ``UPDATE_GOLDEN=1``, is written there)."""
    path = GOLDEN / folder / name
    if UPDATE:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    assert text == path.read_text(encoding="utf-8"), (
        f"{name} differs (UPDATE_GOLDEN=1 to accept a deliberate change)"
    )
