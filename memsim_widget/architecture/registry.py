"""A name -> value registry whose entries are registered by modules imported on first use.

``FAMILIES`` (``architecture.types``) is one: each family module registers its HF ``model_type`` builders when it
is imported, and the table in ``memsim_widget.families`` says which module registers which type. Asking for a
type imports its module then (``registry[type]``, ``.get``, ``in``); listing the names (``iter``, ``len``,
``sorted``) imports nothing, so a process that builds one model loads one family (``memsim estimate`` starts
about 30 ms sooner than with every family imported up front: benchmarks/cli_startup.py).
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping, MutableMapping
from typing import TypeVar

V = TypeVar("V")


class LazyRegistry(MutableMapping[str, V]):
    """Entries registered so far, plus the names a known module will register when it is imported."""

    def __init__(self) -> None:
        self._entries: dict[str, V] = {}
        self._modules: dict[str, str] = {}  # name -> the module that registers it (imported on first use)

    def expect(self, modules: Mapping[str, str]) -> None:
        """Declare which module (dotted name) registers each name; nothing is imported yet."""
        self._modules.update(modules)

    def __getitem__(self, name: str) -> V:
        if name not in self._entries and name in self._modules:
            importlib.import_module(self._modules[name])
        return self._entries[name]

    def __setitem__(self, name: str, value: V) -> None:
        self._entries[name] = value

    def __delitem__(self, name: str) -> None:
        if name not in self._entries and name not in self._modules:
            raise KeyError(name)
        self._entries.pop(name, None)
        self._modules.pop(name, None)

    def _names(self) -> dict[str, None]:
        return dict.fromkeys([*self._modules, *self._entries])

    def __iter__(self) -> Iterator[str]:
        return iter(self._names())

    def __len__(self) -> int:
        return len(self._names())

    def __repr__(self) -> str:
        return f"LazyRegistry({sorted(self._names())!r})"
