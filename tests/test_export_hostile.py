"""Exported files cannot be hijacked by a name (issue 25): every user string that lands in a file (``gpu.name``, the
model folder's path, LoRA target names) is either refused at the scenario boundary with a named field, or written
so that the file's own parser reads it back as that string; the provenance header stays a comment.

Each format is parsed as its runner would: Python's ``ast`` (torchtitan), ``shlex`` with comments and ``bash -n``
(torchtune), PyYAML (every YAML format), ``json`` (DeepSpeed). The names are drawn by hypothesis from line breaks
(``\\n``, ``\\r``, U+2028, U+2029, NEL U+0085, vertical tab, form feed), other control characters (NUL, ESC),
lone surrogates, a bidi override, quotes, shell and YAML metacharacters and characters beyond U+FFFF.
"""

from __future__ import annotations

import ast
import json
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memsim_widget.catalog.models import PRESETS
from memsim_widget.errors import ScenarioError, bad_char, one_line
from memsim_widget.export import FORMATS, export
from memsim_widget.export.common import comment
from memsim_widget.export.yamltext import quoted, scalar, to_yaml
from memsim_widget.scenario import Scenario

#: What a hostile name is made of: line breaks of every syntax, control characters, quotes, shell and YAML
#: metacharacters, a bidi override, wide and astral characters.
HOSTILE = [
    *"ab Z09 '\"$`;|&<>(){}[]#:*!%@\\-_.,?~^=+/",
    *[
        "\n",
        "\r",
        "\r\n",
        "\x00",
        "\x1b",
        "\t",
        "\x0b",
        "\x0c",
        "\x85",
        "\u2028",
        "\u2029",
        "\u202e",
        "\ud800",
    ],
    *["é", "\u3000", "\U0001f600", "\U0010fffd", "ー"],
]
NAMES = st.lists(st.sampled_from(HOSTILE), min_size=1, max_size=24).map("".join)
#: One scenario per format that the format can express (the same as tests/test_export.py's first test).
BASE: dict[str, dict[str, Any]] = {
    "deepspeed": {"precision": "mixed-bf16", "framework": "deepspeed", "parallel": {"dp": 2, "zero": 2}},
    "accelerate": {"precision": "amp-bf16", "parallel": {"dp": 2, "zero": 3}},
    "hf": {"precision": "amp-bf16", "method": "lora"},
    "axolotl": {"precision": "bf16", "method": "lora"},
    "llamafactory": {"precision": "bf16", "method": "lora"},
    "torchtune": {"precision": "bf16", "method": "qlora", "model": "llama-3.2-1b", "framework": "torchtune"},
    "torchtitan": {"precision": "bf16", "framework": "torchtitan", "model": "llama-3.1-8b"},
}
#: The key of each YAML format that holds the model path.
MODEL_KEY = {"hf": "model_name_or_path", "axolotl": "base_model", "llamafactory": "model_name_or_path"}
SLOW = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def _payload(name: str, text: str) -> Any:
    """A file parsed as its runner reads it; the header must be comments for the result to equal the benign one."""
    if name.endswith((".yaml", ".yml")):
        return yaml.safe_load(text)
    if name.endswith(".json"):
        return json.loads(text)
    if name.endswith(".py"):
        return ast.dump(ast.parse(text))
    if name.endswith(".sh"):
        return shlex.split(text, comments=True)
    return None  # the plain-text note beside ds_config.json: checked line by line below


def _header_is_comment(name: str, text: str, lines_expected: int) -> None:
    """Every line of the file, split at every line boundary any reader knows (``str.splitlines``: also NEL,
    U+2028, U+2029, VT, FF), is printable; the header has as many comment lines as the benign file's."""
    lines = text.splitlines()
    assert all(line.isprintable() for line in lines), [line for line in lines if not line.isprintable()]
    if name.endswith(".txt"):
        assert len(lines) == lines_expected
        return
    body = lines[1:] if lines[0].startswith("#!") else lines
    head = next(i for i, line in enumerate(body) if not line.startswith("#"))
    assert head == lines_expected


def _scenario_line(files: dict[str, str]) -> Scenario:
    """The scenario the header's ``Scenario JSON`` line reads back."""
    text = next(t for t in files.values() if "Scenario JSON" in t)
    line = next(line for line in text.splitlines() if "Scenario JSON" in line)
    return Scenario.from_json(line.split(": ", 1)[1])


def _header_lines(name: str, text: str) -> int:
    body = text.splitlines()
    if name.endswith(".txt"):
        return len(body)
    body = body[1:] if body[0].startswith("#!") else body
    return next(i for i, line in enumerate(body) if not line.startswith("#"))


def _refused_or_round_trips(data: dict[str, Any], fmt: str, benign: dict[str, Any], field: str) -> None:
    """Refused naming ``field``, or exported with the header a comment and the payload equal to the benign one
    (``data`` and ``benign`` differ in the name only, which the payload holds nowhere for these formats)."""
    try:
        sc = Scenario.from_dict(data)
    except ScenarioError as exc:
        assert exc.field.startswith(field) and "\n" not in str(exc)
        return
    files, clean = export(sc, fmt), export(benign, fmt)
    assert list(files) == list(clean)
    for name, text in files.items():
        assert _payload(name, text) == _payload(name, clean[name]), name
        _header_is_comment(name, text, _header_lines(name, clean[name]))
    assert _scenario_line(files) == sc


@pytest.mark.parametrize("fmt", list(FORMATS))
@SLOW
@given(name=NAMES)
def test_a_hostile_gpu_name_is_refused_or_stays_in_the_comment(fmt: str, name: str) -> None:
    gpu = {"memory_gib": 80, "name": name}
    base = BASE[fmt]
    _refused_or_round_trips({**base, "gpu": gpu}, fmt, {**base, "gpu": {**gpu, "name": "x"}}, "gpu")


@pytest.mark.parametrize("fmt", ["hf", "axolotl", "llamafactory"])
@SLOW
@given(name=NAMES)
def test_a_hostile_model_folder_is_refused_or_reads_back_as_its_path(
    fmt: str, name: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    if "/" in name or name in (".", ".."):  # no folder is called that: the path is not one folder's
        name = name.replace("/", "_") + "_"
    data = {**BASE[fmt], "model": str(Path("/nonexistent") / name)}
    try:
        Scenario.from_dict(data)
    except ScenarioError as exc:
        assert exc.field == "model" and bad_char(name) is not None and "\n" not in str(exc)
        return
    folder = tmp_path_factory.mktemp("m") / name
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(PRESETS["llama-3.2-1b"]))
    sc = Scenario.from_dict({**data, "model": str(folder)})
    files = export(sc, fmt)
    text = files[next(n for n in files if n.endswith(".yaml") and n != "training_args.yaml")]
    loaded = yaml.safe_load(text)
    assert loaded[MODEL_KEY[fmt]] == str(folder)  # the path reads back as itself, quotes and all
    assert all(line.isprintable() for line in text.splitlines())
    assert _scenario_line(files) == sc


@SLOW
@given(name=NAMES)
def test_torchtune_script_with_a_hostile_gpu_name_is_one_command_for_bash(name: str) -> None:
    bash = shutil.which("bash")
    if bash is None:
        pytest.skip("no bash")
    data = {**BASE["torchtune"], "gpu": {"memory_gib": 80, "name": name}}
    try:
        sc = Scenario.from_dict(data)
    except ScenarioError as exc:
        assert exc.field == "gpu.name"
        return
    text = export(sc, "torchtune")["torchtune_run.sh"]
    assert subprocess.run([bash, "-n"], input=text.encode(), capture_output=True).returncode == 0
    # the script without its comments is one `tune run` command: every code line is part of it
    code = [line for line in text.split("\n") if line and not line.startswith("#")]
    assert code[0].startswith("tune run ") and all(line.endswith("\\") for line in code[:-1])


# ----- the writers' own guards, for any text at all (the boundary is the first guard, these the second) ------------
@settings(max_examples=300, deadline=None)
@given(text=st.text(st.characters(blacklist_categories=["Cs"]), max_size=40))
def test_a_yaml_string_reads_back_as_itself_whatever_it_holds(text: str) -> None:
    assert yaml.safe_load(f"k: {scalar(text)}\n") == {"k": text}
    assert yaml.safe_load(to_yaml({"k": [text, {"m": text}]})) == {"k": [text, {"m": text}]}
    assert quoted(text).isascii() and quoted(text).isprintable()


@settings(max_examples=300, deadline=None)
@given(lines=st.lists(st.text(max_size=30), min_size=1, max_size=4))
def test_a_comment_block_holds_exactly_its_lines_whatever_they_hold(lines: list[str]) -> None:
    block = comment(lines)
    assert block.count("\n") == len(lines) and all(line.isprintable() for line in block.splitlines())
    assert len(block.splitlines()) == len(lines) and all(line.startswith("#") for line in block.splitlines())
    tree = ast.parse(block + "x = 1\n")
    assert len(tree.body) == 1  # Python sees one statement: the comment never becomes code
    assert yaml.safe_load(block + "k: 1\n") == {"k": 1}
    assert shlex.split(block + "echo ok\n", comments=True) == ["echo", "ok"]


def test_one_line_writes_line_breaks_as_escapes() -> None:
    assert one_line("a\nb\u2028c\x85d\x00e\ud800") == "a\\nb\\u2028c\\x85d\\x00e\\ud800"
    assert one_line("plain 'text' $(x) é 😀") == "plain 'text' $(x) é 😀"


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"gpu": {"memory_gib": 80, "name": "H100\nimport os"}}, "gpu.name"),
        ({"gpu": {"memory_gib": 80, "name": "H100\u2028x: 1"}}, "gpu.name"),
        ({"gpu": {"memory_gib": 80, "name": "x" * 129}}, "gpu.name"),
        ({"gpu": {"memory_gib": 80, "name": "a\ud800"}}, "gpu"),
        ({"gpu": "h100\x85"}, "gpu"),
        ({"model": "m\n/config.json"}, "model"),
        ({"model": "m\x00/config.json"}, "model"),
        ({"model": "m\ud800/config.json"}, "model"),
        ({"model": "/" + "m" * 5000}, "model"),
        ({"method": "lora", "lora": {"targets": ["q_proj\n"]}}, "lora.targets[0]"),
        ({"model": {"model_type": "llama\x00"}}, "model.model_type"),
    ],
)
def test_names_that_would_break_a_line_or_a_file_name_are_refused_naming_the_field(
    data: dict[str, Any], field: str
) -> None:
    with pytest.raises(ScenarioError) as exc:
        Scenario.from_dict(data)
    assert exc.value.field.startswith(field) and "\n" not in str(exc.value)
