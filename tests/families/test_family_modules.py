"""Adding a family is one module in ``memsim_widget/families/`` (named in ``MODULES``) and one test: every family
module is imported and registers at least one HF ``model_type``; helper modules (``_*.py``) register none."""

from __future__ import annotations

from pathlib import Path

import memsim_widget.families as families
from memsim_widget.architecture import FAMILIES

FOLDER = Path(families.__file__).parent


def _registered_by(module: str) -> list[str]:
    return sorted(
        mt for mt, build in FAMILIES.items() if build.__module__ == f"memsim_widget.families.{module}"
    )


def test_every_family_module_is_in_modules() -> None:
    on_disk = {p.stem for p in FOLDER.glob("*.py") if not p.stem.startswith("_")}
    assert sorted(on_disk) == sorted(families.MODULES)
    assert len(set(families.MODULES)) == len(families.MODULES)


def test_every_family_module_registers_a_model_type() -> None:
    assert {m: _registered_by(m) for m in families.MODULES if not _registered_by(m)} == {}
    assert all(not _registered_by(p.stem) for p in FOLDER.glob("_*.py"))


def test_every_builder_lives_in_a_family_module() -> None:
    homes = {build.__module__ for build in FAMILIES.values() if build.__module__.startswith("memsim_widget.")}
    assert homes == {f"memsim_widget.families.{m}" for m in families.MODULES}
