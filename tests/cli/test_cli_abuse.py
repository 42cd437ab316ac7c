"""Bad input at the boundary never stalls and never raises a traceback (issue 25): special files, NUL and lone
surrogates in paths, duplicate JSON keys, an empty key, huge model dimensions, unknown model types, pipeline
depths and planner sizes past any real run. Each is one line naming the field, exit status 2, at once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from memsim_widget.catalog.models import PRESETS
from memsim_widget.cli import main
from memsim_widget.errors import ScenarioError
from memsim_widget.jsonio import parse_json_object
from memsim_widget.scenario import Scenario

ROOT = Path(__file__).resolve().parents[2]
SMALL = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
         "intermediate_size": 128, "vocab_size": 100}  # fmt: skip


def _within(seconds: float, call: Callable[[], Any]) -> Any:
    """``call()`` in a daemon thread; fails (instead of hanging the suite) if it has not returned in time."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = call()
        except BaseException as exc:  # noqa: BLE001 -- handed back to the test
            box["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still running after {seconds} s"
    if "error" in box:
        raise box["error"]
    return box["value"]


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """Run ``memsim argv`` (bounded in time); it must exit 2 with one error line, which is returned."""
    code = _within(10, lambda: main(list(argv)))
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and err.startswith("memsim: error: "), err
    return err


@pytest.mark.parametrize("where", ["model", "scenario"])
def test_a_fifo_is_refused_at_once_not_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], where: str
) -> None:
    fifo = tmp_path / "config.json"
    os.mkfifo(fifo)  # nobody writes to it: a read would block forever
    argv = ["estimate", "--model", str(fifo)] if where == "model" else ["estimate", str(fifo)]
    err = _cli(capsys, *argv)
    assert f"{where}: " in err and "FIFO" in err and "not a regular file" in err


def test_a_folder_without_config_and_a_device_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "config.json").mkdir()
    assert "folder" in _cli(capsys, "estimate", "--model", str(tmp_path / "config.json"))
    if os.path.exists("/dev/zero"):  # an endless file: refused from its stat, never read
        assert "device" in _cli(capsys, "estimate", "--model", "/dev/zero")
        assert "device" in _cli(capsys, "estimate", "/dev/zero")


@pytest.mark.parametrize("path", ["a\x00b/config.json", "a\ud800b/config.json", "/tmp/x\n/config.json"])
def test_nul_surrogates_and_line_breaks_in_a_model_path_are_one_named_error(path: str) -> None:
    with pytest.raises(ScenarioError) as exc:
        Scenario.from_dict({"model": path})
    assert exc.value.field == "model" and "\n" not in str(exc.value)


def test_a_surrogate_in_a_gpu_name_is_refused_before_any_output(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ScenarioError) as exc:
        Scenario.from_dict({"gpu": {"memory_gib": 80, "name": "card \udcff"}})
    assert exc.value.field.startswith("gpu")


@pytest.mark.parametrize(
    ("text", "key"),
    [('{"seq_len": 1024, "seq_len": 4096}', "'seq_len'"), ('{"parallel": {"tp": 2, "tp": 8}}', "'tp'"),
     ('{"model": {"model_type": "llama", "hidden_size": 8, "hidden_size": 9}}', "'hidden_size'")],
)  # fmt: skip
def test_a_key_given_twice_is_refused_naming_it(text: str, key: str) -> None:
    with pytest.raises(ScenarioError) as exc:
        parse_json_object(text, "scenario", "the file")
    assert key in str(exc.value) and "twice" in str(exc.value)


def test_a_duplicate_key_in_a_scenario_file_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    f = tmp_path / "s.json"
    f.write_text('{"micro_batch_size": 1, "micro_batch_size": 64}')
    assert "'micro_batch_size' twice" in _cli(capsys, "estimate", str(f))


@pytest.mark.parametrize(("data", "field"), [({"": 1}, '""'), ({"parallel": {"": 1}}, 'parallel.""'),
                                             ({"lora": {"": 1}}, 'lora.""')])  # fmt: skip
def test_an_empty_key_is_a_named_field(data: dict[str, Any], field: str) -> None:
    with pytest.raises(ScenarioError) as exc:
        Scenario.from_dict(data)
    assert exc.value.field == field


@pytest.mark.parametrize("value", [2**40, 10**154, 10**200])
@pytest.mark.parametrize("key", ["hidden_size", "num_hidden_layers", "vocab_size", "intermediate_size"])
def test_model_dimensions_past_2_to_the_40_are_refused_naming_the_key(key: str, value: int) -> None:
    from memsim_widget import estimate

    with pytest.raises(ScenarioError) as exc:
        estimate(Scenario.from_dict({"model": {**SMALL, key: value}}))
    assert exc.value.field == f"model.{key}" and "2**40" in str(exc.value) and len(str(exc.value)) < 200


def test_an_unknown_model_type_is_refused_without_importing_transformers() -> None:
    """The refusal must not wait for transformers (seconds): it is decided from transformers' source text."""
    code = (
        "import sys; from memsim_widget import estimate, Scenario, ScenarioError\n"
        "for mt in ('zzz_not_a_model', 'x' * 500, 'a b\\n', 'llama.'):\n"
        "    try: estimate(Scenario.from_dict({'model': {'model_type': mt, 'hidden_size': 8}}))\n"
        "    except ScenarioError as e: assert e.field == 'model.model_type', e\n"
        "print('transformers' in sys.modules, 'torch' in sys.modules)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["False", "False"]


def test_pipeline_depth_is_bounded(capsys: pytest.CaptureFixture[str]) -> None:
    deep = {**SMALL, "num_hidden_layers": 2**20}
    with pytest.raises(ScenarioError) as exc:
        Scenario.from_dict({"model": deep, "parallel": {"pp": 2**20}})
    assert exc.value.field == "parallel.pp" and "1,024" in str(exc.value)
    with pytest.raises(ScenarioError) as exc:
        Scenario.from_dict({"model": deep, "parallel": {"pp": 512, "virtual_stages": 4}})
    assert exc.value.field == "parallel.virtual_stages"
    assert "parallel.pp" in _cli(capsys, "estimate", "--pp", str(2**13))


def test_plan_top_and_gpu_counts_are_bounded(capsys: pytest.CaptureFixture[str]) -> None:
    assert "--top" in _cli(capsys, "plan", "--top", str(10**9), "--json")
    many = ",".join(str(n) for n in range(1, 2001))
    err = _cli(capsys, "plan", "--gpus", many)
    assert "gpus: at most 32 GPU counts" in err


def test_a_model_folder_holding_config_json_still_works(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "config.json").write_text(json.dumps(PRESETS["llama-3.2-1b"]))
    assert main(["estimate", "--model", str(tmp_path)]) == 0
    assert "llama" in capsys.readouterr().out.lower()
