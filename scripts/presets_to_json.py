"""Convert a ``catalog/models.py`` that holds the presets as dict literals (``PRESETS`` and ``PRESET_INFO``) into
the data files ``memsim_widget/catalog/presets/<model_type>.json``, one per HF ``model_type`` in catalog order.

For a branch written before the presets became data: ``python scripts/presets_to_json.py main:memsim_widget/
catalog/models.py`` reads that file from git (a plain path works too), writes every JSON file, and prints the
``PRESET_FILES`` order and the count and checksum that ``tests/families/test_presets_data.py`` pins. Run it from the
repository root with the package importable (``PYTHONPATH=$PWD``); the old module is imported inside
``memsim_widget.catalog``, so its relative imports resolve against the current package.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "memsim_widget" / "catalog" / "presets"


def table_checksum(presets: dict[str, dict[str, Any]], info: dict[str, dict[str, str]]) -> str:
    """One hash of both tables, their order and every value's Python type (repr tells 1 from 1.0, a list from
    a tuple); tests/families/test_presets_data.py computes the same."""
    text = repr(([(pid, presets[pid]) for pid in presets], [(pid, info[pid]) for pid in info]))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _source_text(source: str) -> str:
    """A file's text, or ``REV:path`` read from git."""
    if Path(source).is_file():
        return Path(source).read_text(encoding="utf-8")
    return subprocess.run(
        ["git", "show", source], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout


def load_dict_tables(source: str) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, str]]]:
    """``PRESETS`` and ``PRESET_INFO`` of an old-style models.py, imported as a module of memsim_widget.catalog."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "dict_models.py"
        path.write_text(_source_text(source), encoding="utf-8")
        spec = importlib.util.spec_from_file_location("memsim_widget.catalog._dict_models", path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
    return module.PRESETS, module.PRESET_INFO


def group_by_model_type(
    presets: dict[str, dict[str, Any]], info: dict[str, dict[str, str]]
) -> dict[str, dict[str, dict[str, Any]]]:
    """Model type -> {preset id: {"info", "config"}}, in catalog order; refuses a model type whose presets are
    not next to each other (one file per type could not keep the catalog order) or tables that disagree."""
    if list(presets) != list(info):
        raise SystemExit("PRESETS and PRESET_INFO list different ids, or the same ids in another order")
    files: dict[str, dict[str, dict[str, Any]]] = {}
    last = None
    for pid, config in presets.items():
        model_type = config["model_type"]
        if model_type != last and model_type in files:
            raise SystemExit(f"the {model_type!r} presets are not contiguous ({pid!r}): reorder them first")
        files.setdefault(model_type, {})[pid] = {"info": info[pid], "config": config}
        last = model_type
    return files


def write_files(files: dict[str, dict[str, dict[str, Any]]]) -> None:
    """Write one JSON file per model type and remove files no type names any more."""
    OUT.mkdir(exist_ok=True)
    for stale in set(OUT.glob("*.json")) - {OUT / f"{name}.json" for name in files}:
        stale.unlink()
    for name, entries in files.items():
        text = json.dumps(entries, indent=2, ensure_ascii=False)
        (OUT / f"{name}.json").write_text(text + "\n", encoding="utf-8")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("source", help="an old-style models.py: a path, or REV:path read from git")
    args = ap.parse_args()
    presets, info = load_dict_tables(args.source)
    files = group_by_model_type(presets, info)
    write_files(files)
    print(f"wrote {len(files)} files, {len(presets)} presets to {OUT.relative_to(ROOT)}")
    print("PRESET_FILES = (" + ", ".join(repr(name) for name in files) + ")")
    print(f"PRESET_COUNT = {len(presets)}")
    print(f'PRESET_CHECKSUM = "{table_checksum(presets, info)}"')


if __name__ == "__main__":
    main()
