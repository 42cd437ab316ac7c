"""Adding a family is one module in ``memsim_widget/families/`` and one test: ``MODEL_TYPES`` is read from each
module's ``@register_family("...")`` lines, every family module registers exactly the HF ``model_type`` values read
there, and is imported only when one of them is built; helper modules (``_*.py``) register none."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

import memsim_widget.families as families
from memsim_widget.architecture import FAMILIES

FOLDER = Path(families.__file__).parent


def _registered_by(module: str) -> list[str]:
    importlib.import_module(f"memsim_widget.families.{module}")
    return sorted(
        mt for mt, build in FAMILIES.items() if build.__module__ == f"memsim_widget.families.{module}"
    )


def test_every_family_module_is_in_modules() -> None:
    on_disk = {p.stem for p in FOLDER.glob("*.py") if not p.stem.startswith("_")}
    assert sorted(on_disk) == sorted(families.MODULES)
    # a decorator whose names are not string literals reads as no type: the module could never be found
    assert [m for m, types in families.MODEL_TYPES.items() if not types] == []


def test_every_family_module_registers_a_model_type() -> None:
    assert {m: _registered_by(m) for m in families.MODULES if not _registered_by(m)} == {}
    assert all(not _registered_by(p.stem) for p in FOLDER.glob("_*.py"))


def test_every_builder_lives_in_a_family_module() -> None:
    homes = {build.__module__ for build in FAMILIES.values() if build.__module__.startswith("memsim_widget.")}
    assert homes == {f"memsim_widget.families.{m}" for m in families.MODULES}


def test_the_table_says_what_each_module_registers() -> None:
    """The lazy registry imports the module the table names: a type registered elsewhere would never be found."""
    assert {m: _registered_by(m) for m in families.MODULES} == {
        m: sorted(types) for m, types in families.MODEL_TYPES.items()
    }
    assert sorted(FAMILIES) == sorted(mt for types in families.MODEL_TYPES.values() for mt in types)


def test_a_process_imports_only_the_families_it_builds() -> None:
    """Building a Llama loads the llama module alone; listing the types loads none; LLaVA loads its text family (its tower is in architecture.vision)."""
    code = (
        "import sys; from memsim_widget.architecture import FAMILIES, build_architecture; "
        "from memsim_widget.catalog.models import PRESETS; "
        "loaded = lambda: sorted(m.rsplit('.', 1)[1] for m in sys.modules if m.startswith('memsim_widget.families.')); "
        "names = sorted(FAMILIES); print(loaded()); "
        "build_architecture(PRESETS['llama-3.1-8b']); print(loaded()); "
        "build_architecture(PRESETS['llava-1.5-7b']); print(loaded())"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert run.stdout.splitlines() == ["[]", "['llama']", "['llama', 'llava']"]


def test_lazy_registry_imports_on_first_use_only() -> None:
    """Listing names imports nothing; asking for one imports its module, which must register it (else KeyError,
    as for a name nobody registers); a registered entry needs no import; deleting an unloaded name forgets it."""
    from memsim_widget.architecture.registry import LazyRegistry

    reg: LazyRegistry[int] = LazyRegistry()
    reg.expect({"lists": "memsim_widget.units", "never": "memsim_widget.units"})
    reg["set"] = 1
    assert sorted(reg) == ["lists", "never", "set"] and len(reg) == 3
    assert reg["set"] == 1 and reg.get("nobody") is None
    with pytest.raises(KeyError):
        reg["lists"]  # the module imports but registers nothing under that name
    del reg["never"]
    assert sorted(reg) == ["lists", "set"]
    with pytest.raises(KeyError):
        del reg["nobody"]
