"""What starting ``memsim`` loads (issue 28: the CLI's import under 40 ms beyond numpy and pandas).

The time itself is printed by ``benchmarks/cli_startup.py``; these tests hold what it depends on, in a fresh
process each: no heavy package, only the family modules the scenario's model needs, nothing of the layers the
command does not use, and every dataclass on the way defined by ``memsim_widget.fast_dataclass`` (the standard
decorator compiles five or six methods per class: ~25 ms more for the ~60 classes an estimate defines).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from memsim_widget.scenario import DEFAULT_RESERVED_MODEL

#: Packages no CLI start loads: the widget stack, torch and its model library, the data-frame stack.
HEAVY = (
    "torch",
    "transformers",
    "altair",
    "ipywidgets",
    "anywidget",
    "IPython",
    "pandas",
    "numpy",
    "vl_convert",
)

#: The package's layers above the engine that ``memsim estimate`` does not use (the planner, charts, widget, page,
#: traces, launch-config importers, comparisons, calibration from traces).
UNUSED_LAYERS = ("plan", "charts", "widget", "app", "trace", "importers", "comparison", "calibrate")

#: The allocation-stream replay, its caching allocator and the replay on the card: a scenario whose reserved model is
#: ``replay`` (``reserved_model``, unset: ``DEFAULT_RESERVED_MODEL``) on a step the stream models uses them; the
#: fitted rule (engine/counters/overhead.py) does not.
REPLAY = (
    "memsim_widget.engine.counters.alloc_stream",
    "memsim_widget.engine.counters.allocator",
    "memsim_widget.engine.counters.card_replay",
)
#: Whether the stream models the step: asked wherever the reserved model is ``replay``, without loading ``REPLAY``.
PREDICATES = "memsim_widget.engine.counters.replayable"

#: Run the CLI as ``memsim`` does, then print what the process loaded and which dataclasses its package modules
#: defined with the standard decorator (theirs would be ``dataclasses``'s ``__eq__``, compiled from text).
_PROBE = """
import contextlib, io, json, runpy, sys
sys.argv = ["memsim", *ARGS]
with contextlib.redirect_stdout(io.StringIO()):
    try:
        runpy.run_module("memsim_widget.cli", run_name="__main__")
    except SystemExit as exc:
        assert not exc.code, exc.code
standard = sorted(
    f"{m.__name__}.{c.__qualname__}"
    for m in list(sys.modules.values()) if getattr(m, "__name__", "").startswith("memsim_widget")
    for c in vars(m).values()
    if isinstance(c, type) and "__dataclass_fields__" in c.__dict__ and c.__module__ == m.__name__
    and c.__eq__.__code__.co_filename == "<string>"
)
print(json.dumps({"modules": sorted(sys.modules), "standard": standard}))
"""


def _loaded(*args: str) -> tuple[set[str], list[str]]:
    """The modules a fresh ``memsim ARGS`` process loaded, and its package's standard-library dataclasses."""
    code = _PROBE.replace("ARGS", repr(list(args)))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    data = json.loads(out.splitlines()[-1])
    return set(data["modules"]), data["standard"]


def _families(modules: set[str]) -> set[str]:
    return {m.rpartition(".")[2] for m in modules if m.startswith("memsim_widget.families.")}


def _layers(modules: set[str]) -> set[str]:
    return {m.split(".")[1] for m in modules if m.startswith("memsim_widget.")} & set(UNUSED_LAYERS)


@pytest.mark.parametrize(
    ("args", "family"),
    [
        (["--model", "llama-3.1-8b"], "llama"),
        (["--model", "mixtral-8x7b"], "mixtral"),
        (["--model", "deepseek-v2-lite"], "deepseek"),
        (
            ["--model", "bert-base-uncased", "--seq-len", "512", "--train-tokens", "1e9"],
            "bert",
        ),  # and its cost
    ],
)
def test_an_estimate_loads_its_models_family_alone_and_nothing_heavy(args: list[str], family: str) -> None:
    modules, standard = _loaded("estimate", *args)
    assert _families(modules) == {family}
    assert sorted(m for m in HEAVY if m in modules) == []
    assert _layers(modules) == set()
    assert sorted(m for m in REPLAY if m in modules) == (
        sorted(REPLAY) if DEFAULT_RESERVED_MODEL == "replay" else []
    )
    assert standard == []


def test_an_estimate_asking_for_the_fitted_rule_loads_no_allocator() -> None:
    modules, standard = _loaded("estimate", "--model", "llama-3.2-1b", "--reserved-model", "fitted")
    assert sorted(m for m in REPLAY if m in modules) == []
    assert PREDICATES not in modules
    assert standard == []


def test_an_estimate_asking_for_the_replay_loads_the_allocator() -> None:
    modules, standard = _loaded("estimate", "--model", "llama-3.2-1b", "--reserved-model", "replay")
    assert sorted(m for m in REPLAY if m in modules) == sorted(REPLAY)
    assert PREDICATES in modules
    assert standard == []


def test_the_replay_asked_of_a_step_the_stream_does_not_model_loads_no_allocator() -> None:
    """Context parallelism keeps the fitted rule (``replayable.replayable``): deciding so loads the predicates
    alone, not the stream's writers nor the allocator."""
    modules, standard = _loaded(
        "estimate", "--model", "llama-3.2-1b", "--reserved-model", "replay", "--cp", "2"
    )
    assert PREDICATES in modules
    assert sorted(m for m in REPLAY if m in modules) == []
    assert standard == []


@pytest.mark.parametrize("args", [["--help"], ["gpus"]])
def test_help_and_the_gpu_list_load_no_model_and_no_engine(args: list[str]) -> None:
    modules, _ = _loaded(*args)
    assert _families(modules) == set()
    assert not any(m == "memsim_widget.engine" or m.startswith("memsim_widget.engine.") for m in modules)
    assert "memsim_widget.architecture" not in modules
    assert sorted(m for m in HEAVY if m in modules) == []
    if args == ["--help"]:  # the help reads the scenario's schema (named tuples): not even ``dataclasses``
        assert "dataclasses" not in modules


def test_the_probe_sees_a_standard_dataclass_and_a_family() -> None:
    """A check of the check: a class made by ``dataclasses.dataclass`` in a package module is reported, and a
    family module imported is counted."""
    code = _PROBE.replace("ARGS", repr(["gpus"])).replace(
        'sys.argv = ["memsim"',
        "import dataclasses, memsim_widget.families.gpt2, memsim_widget.errors as e\n"
        "e.Std = dataclasses.dataclass(type('Std', (), {'__annotations__': {'a': 'int'}, '__module__': e.__name__}))\n"
        'sys.argv = ["memsim"',
    )
    data = json.loads(
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    )
    assert data["standard"] == ["memsim_widget.errors.Std"]
    assert _families(set(data["modules"])) == {"gpt2"}
