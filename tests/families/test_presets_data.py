"""The presets are data files (``memsim_widget/catalog/presets/<model_type>.json``) read by one loader; the tables
it yields are the dict literals they were converted from, and the files ship in the wheel."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import zipfile
from importlib import resources
from pathlib import Path

import pytest

from memsim_widget.catalog.models import PRESET_FILES, PRESET_INFO, PRESETS, load_presets

ROOT = Path(__file__).resolve().parents[2]
FOLDER = ROOT / "memsim_widget" / "catalog" / "presets"

#: What ``scripts/presets_to_json.py`` printed for the dict-literal ``catalog/models.py`` it converted: the number
#: of presets and one hash of both tables (order, values and their Python types); rerun it to convert a branch.
PRESET_COUNT = 112
PRESET_CHECKSUM = "9aaa41635c02314f328de2fb06d80ec0e703493932686c5a606e25423ad71f61"


def table_checksum(presets: dict, info: dict) -> str:
    """The converter's checksum (``scripts/presets_to_json.py``): repr tells 1 from 1.0 and a list from a tuple."""
    text = repr(([(pid, presets[pid]) for pid in presets], [(pid, info[pid]) for pid in info]))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def test_loaded_tables_equal_the_dicts_they_were_converted_from() -> None:
    """A fresh load (other tests hand the module's tables to transformers, which may edit nested dicts)."""
    configs, infos = load_presets()
    assert len(configs) == PRESET_COUNT
    assert list(infos) == list(configs)
    assert table_checksum(configs, infos) == PRESET_CHECKSUM


def test_the_module_tables_are_one_load_of_the_files() -> None:
    configs, infos = load_presets()
    assert list(PRESETS) == list(configs) and list(PRESET_INFO) == list(infos)
    assert infos == PRESET_INFO
    assert configs["gpt2"] is not PRESETS["gpt2"]


def test_every_file_is_listed_once_and_holds_its_model_type_only() -> None:
    assert sorted(PRESET_FILES) == sorted(p.stem for p in FOLDER.glob("*.json"))
    assert len(set(PRESET_FILES)) == len(PRESET_FILES)
    for name in PRESET_FILES:
        entries = json.loads((FOLDER / f"{name}.json").read_text(encoding="utf-8"))
        assert entries, name
        for pid, entry in entries.items():
            assert set(entry) == {"info", "config"}, pid
            assert entry["config"]["model_type"] == name, pid
            assert set(entry["info"]) == {"description", "params_label", "hf_repo"}, pid


def test_package_resources_find_the_preset_files() -> None:
    folder = resources.files("memsim_widget.catalog").joinpath("presets")
    assert {f"{name}.json" for name in PRESET_FILES} <= {p.name for p in folder.iterdir()}


def test_wheel_ships_the_preset_files(tmp_path: Path) -> None:
    """Build the wheel and load the catalog from it: the JSON files travel as package data."""
    pytest.importorskip("hatchling")
    out = tmp_path / "dist"
    subprocess.run(
        [sys.executable, "-m", "hatchling", "build", "-t", "wheel", "-d", str(out)],
        cwd=ROOT,
        check=True,
        capture_output=True,
    )
    (wheel,) = out.glob("*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {f"memsim_widget/catalog/presets/{name}.json" for name in PRESET_FILES} <= names
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    code = (
        "import memsim_widget.catalog.models as m, pathlib, sys; "
        "assert pathlib.Path(m.__file__).is_relative_to(pathlib.Path(sys.argv[1])), m.__file__; "
        "print(len(m.PRESETS), m.architecture_for('llama-3.1-8b').parameters)"
    )
    run = subprocess.run(
        [sys.executable, "-c", code, str(site)],
        env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"},
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == [str(PRESET_COUNT), "8030261248"]
