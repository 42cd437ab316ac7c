"""The scenario schema (``memsim_widget.scenario_schema``): every key the scenario accepts is declared once, and the
CLI and the widget offer exactly the fields marked for them, with the schema's names, types and choices; the docs
build writes docs/scenario.md's field table from it (scripts/mkdocs_hooks.py), so a new choice touches no page."""

from __future__ import annotations

import argparse
import importlib.util
from dataclasses import fields
from pathlib import Path

import pytest

import memsim_widget.engine.frameworks  # noqa: F401  (registers paged-adamw, as the CLI and widget load it)
from memsim_widget.cli import OVERRIDES, PLAN_FIXED, build_parser
from memsim_widget.errors import ScenarioError
from memsim_widget.optimizers import OPTIMIZERS
from memsim_widget.scenario import (
    DEFAULTS,
    OPTIONAL_KEYS,
    LoraConfig,
    ParallelConfig,
    RLConfig,
    Scenario,
)
from memsim_widget.scenario_schema import (
    BY_KEY,
    FIELDSETS,
    SCHEMA,
    cli_fields,
    widget_fields,
)
from memsim_widget.widget.controls import CONTROLS, CUSTOM_DIMS, build_options

#: The nested blocks of a scenario: their own keys are the dotted leaves.
SECTIONS = {"lora": LoraConfig, "parallel": ParallelConfig, "rl": RLConfig}


def scenario_keys() -> list[str]:
    """Every key a scenario accepts, as the scenario module defines them (top-level and dotted nested leaves)."""
    top = [k for k in (*DEFAULTS, *OPTIONAL_KEYS) if k not in SECTIONS]
    nested = [f"{s}.{f.name}" for s, cls in SECTIONS.items() for f in fields(cls)]
    return top + nested


def test_every_scenario_key_has_exactly_one_schema_entry() -> None:
    declared = [f.key for f in SCHEMA if f.scenario]
    assert len(declared) == len(set(declared)), "a key declared twice"
    assert sorted(declared) == sorted(scenario_keys())
    assert len({f.key for f in SCHEMA}) == len(SCHEMA)
    assert set(BY_KEY) == {f.key for f in SCHEMA}


def test_every_entry_has_a_doc_and_the_unset_keys_are_the_optional_ones() -> None:
    assert all(f.doc.strip() for f in SCHEMA)
    assert {f.key for f in SCHEMA if f.scenario and f.optional} == {
        "num_gpus",  # DEFAULTS' one None: checked when given
        *(k for k in OPTIONAL_KEYS if k not in SECTIONS),
        *(f"{s}.{f.name}" for s, cls in SECTIONS.items() for f in fields(cls) if f.default is None),
    }


def test_the_cli_flags_are_the_entries_marked_for_the_cli() -> None:
    assert {f.cli: (f.key, f.type) for f in cli_fields()} == OVERRIDES
    assert all(PLAN_FIXED[flag] == OVERRIDES[flag] for flag in PLAN_FIXED)
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for command in ("estimate", "recommend", "trace"):
        flags = {
            a.dest: a.help for a in sub.choices[command]._actions if a.help and a.help.startswith("override ")
        }
        assert flags == {f.cli: f"override {f.key}" for f in cli_fields()}, command


def test_a_flag_sets_its_key() -> None:
    """Each flag's value lands under its dotted key (one flag per parse, a value of its type)."""
    from memsim_widget.cli import _apply_overrides

    parser = build_parser()
    for f in cli_fields():
        assert f.cli is not None
        value = {int: "2", float: "0.5", bool: "true", str: "x"}[f.type]
        args = parser.parse_args(["estimate", "--" + f.cli.replace("_", "-"), value])
        data = _apply_overrides({}, args)
        *parents, leaf = f.key.split(".")
        for p in parents:
            data = data[p]
        assert data[leaf] == {int: 2, float: 0.5, bool: True, str: "x"}[f.type]


def test_the_widget_controls_are_the_entries_marked_for_the_widget() -> None:
    drawn = widget_fields()
    assert [c[0] for c in CONTROLS] == [f.key for f in drawn]
    assert {f.key for f in SCHEMA if f.widget} == {c[0] for c in CONTROLS}
    groups = [c[3] for c in CONTROLS]
    assert groups == sorted(groups, key=FIELDSETS.index), "controls drawn fieldset by fieldset"
    assert tuple(k.removeprefix("model.") for k, *_ in CONTROLS if k.startswith("model.")) == CUSTOM_DIMS


def test_the_widget_offers_each_select_its_schema_choices() -> None:
    choices = build_options({})["choices"]
    selects = [f for f in widget_fields() if f.widget and f.widget.kind == "select"]
    assert set(choices) == {f.key for f in selects}
    for f in selects:
        assert choices[f.key] == [*([None] if f.optional else []), *f.allowed()], f.key


@pytest.mark.parametrize("f", [f for f in SCHEMA if f.choices is not None], ids=lambda f: f.key)
def test_the_scenario_refuses_a_value_outside_the_choices(f) -> None:
    """Each declared set of choices is the one the scenario checks: a value outside it is refused, naming the key."""
    assert f.allowed(), f"{f.key}: its choices resolve to nothing"
    *parents, leaf = f.key.split(".")
    data: dict = {leaf: "no-such-choice"}
    for p in reversed(parents):
        data = {p: data}
    with pytest.raises(ScenarioError) as err:
        Scenario.from_dict(data)
    assert err.value.field == f.key


#: The page whose field table the docs build writes from the schema.
PAGE = Path(__file__).resolve().parents[1] / "docs" / "scenario.md"


def test_the_docs_build_writes_every_field_and_every_optimizer_into_docs_scenario_md() -> None:
    """The page holds the marker once and no table of its own; the hook puts a row per field in its place, the
    optimizer row naming every registered optimizer."""
    pytest.importorskip("mkdocs")
    spec = importlib.util.spec_from_file_location(
        "mkdocs_hooks", PAGE.parents[1] / "scripts" / "mkdocs_hooks.py"
    )
    assert spec and spec.loader
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    text = PAGE.read_text()
    assert text.count("<!-- generated: scenario fields -->") == 1 and "\n| `" not in text
    page = hooks.fill_generated(text)
    assert page.count("\n| `") == len(SCHEMA)
    row = next(line for line in page.splitlines() if line.startswith("| `optimizer` |"))
    assert all(f"`{name}`" in row for name in OPTIMIZERS)
