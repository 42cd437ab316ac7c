"""Model families: one module per family, each registering its builders with
``memsim_widget.architecture.register_family`` (HF ``model_type`` -> Architecture).

A new family is one module here (and one test): nothing else lists it. The modules are not imported here:
``MODEL_TYPES`` is read from each module's ``@register_family("<model_type>", ...)`` lines (string literals, read
as text, about 2 ms for the whole folder), and ``memsim_widget.architecture`` hands it to its registry
(``FAMILIES``), which imports a family's module the first time one of its model types is built, so a process
loads only the families it uses (tests/families/test_family_modules.py holds the table equal to what each module
registers when imported). Modules whose name starts with ``_`` hold helpers shared by several families and
register nothing.
"""

from __future__ import annotations

import re
from pathlib import Path

#: A decorator line ``@register_family("a", "b")`` at the start of a line (after a newline: a literal prefix the
#: regex engine searches fast, where ``^`` with MULTILINE tries every position, ~1 ms of every CLI start), and the
#: string literals in it.
_DECORATOR = re.compile(r"\n@register_family\(([^)]*)\)")
_LITERAL = re.compile(r"\"([^\"]+)\"")


def _read_model_types() -> dict[str, tuple[str, ...]]:
    """Each family module of this folder -> the model types its decorators name, in file order."""
    out: dict[str, tuple[str, ...]] = {}
    for path in sorted(Path(__file__).parent.glob("[!_]*.py")):
        text = "\n" + path.read_text(encoding="utf-8")
        out[path.stem] = tuple(t for m in _DECORATOR.finditer(text) for t in _LITERAL.findall(m.group(1)))
    return out


#: Each family module of this package and the HF ``model_type`` values it registers (read from its source).
MODEL_TYPES: dict[str, tuple[str, ...]] = _read_model_types()

#: The family modules of this package.
MODULES: tuple[str, ...] = tuple(MODEL_TYPES)


def module_of_type() -> dict[str, str]:
    """HF ``model_type`` -> the dotted name of the family module that registers it."""
    return {mt: f"{__name__}.{module}" for module, types in MODEL_TYPES.items() for mt in types}
