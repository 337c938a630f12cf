"""The vendor table drives device-config parsing, and docs/configuration.md is generated from the
config dataclasses' attribute docstrings."""

import dataclasses
import importlib.util
from pathlib import Path

import pytest

from hami.config import DeviceConfig, load_config
from hami.errors import ConfigError
from hami.vendors import VENDOR_SECTIONS, build_vendors

ROOT = Path(__file__).resolve().parents[2]


def _generator():
    spec = importlib.util.spec_from_file_location(
        "gen_configuration_doc", ROOT / "scripts" / "gen_configuration_doc.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_configuration_doc_is_current():
    gen = _generator()
    committed = (ROOT / "docs" / "configuration.md").read_text()
    assert committed == gen.render(), (
        "docs/configuration.md is stale: run python scripts/gen_configuration_doc.py"
    )


def test_every_config_field_has_an_attribute_docstring():
    gen = _generator()
    for key, entry in VENDOR_SECTIONS.items():
        for cls in (entry.config, *getattr(entry.config, "DOC_PARTS", ())):
            docs = gen.field_docs(cls)
            missing = [f.name for f in dataclasses.fields(cls) if not docs.get(f.name)]
            assert missing == [], f"{key}: {cls.__qualname__} fields without docstring: {missing}"


def test_unknown_top_level_key_lists_every_table_section():
    with pytest.raises(ConfigError) as e:
        load_config({"nvidiaa": {}})
    msg = str(e.value)
    assert msg.startswith("nvidiaa: unknown top-level key; valid: ")
    for key in VENDOR_SECTIONS:
        assert key in msg


def test_unknown_key_inside_a_vendor_section_names_section_and_valid_keys():
    with pytest.raises(
        ConfigError, match=r"^hygon\.memFactor: unknown key; valid keys: memoryFactor, resourceCoreName"
    ):
        load_config({"hygon": {"memFactor": 2}})
    with pytest.raises(ConfigError, match=r"^hygon\.memoryFactor: 0 is invalid; valid: an integer >= 1$"):
        load_config({"hygon": {"memoryFactor": 0}})


def test_sections_absent_from_the_file_take_their_defaults():
    cfg = load_config({"hygon": {"resourceCountName": "hygon.com/dcu"}})
    assert cfg.section("hygon").resourceCountName == "hygon.com/dcu"
    assert DeviceConfig().section("hygon").resourceCountName == "hygon.com/dcunum"
    vendors = build_vendors(cfg)
    assert list(vendors)[0] == "NVIDIA"
    assert vendors["DCU"].resource_names().count == "hygon.com/dcu"
