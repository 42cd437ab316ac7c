"""Bad CLI input never reaches a traceback (issue 14): one line on stderr naming the field or flag, exit 2.

Each bad invocation below is what a careless user (or a fuzzer) types: files that are binary, in the wrong
encoding, empty, huge or nested 100,000 deep; numbers with 5,000 digits, NaN and infinity; a headroom that
leaves nothing usable; GPU counts past any machine; flags that do not exist. Every one must exit with
status 2, print nothing on stdout and exactly one line on stderr that starts ``memsim: error:`` and names
the field or flag that is wrong. The good invocations at the end check that the boundary refuses only
nonsense.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys

import pytest

from memsim_widget.cli import main, parse_gpus
from memsim_widget.jsonio import MAX_JSON_BYTES, MAX_JSON_DEPTH

GiB = 2**30
DIGITS = "7" * 5000
DEEP = 100_000


def _obj(data: object) -> bytes:
    return json.dumps(data).encode()


#: Scenario files the bad invocations read, by name (``@name`` in an argv is the file's path).
FILES: dict[str, bytes] = {
    "binary.json": bytes(range(256)) * 4,
    "latin1.json": '{"model": "llama-3.2-1b", "gpu": "café"}'.encode("latin-1"),
    "utf16.json": '{"model": "llama-3.2-1b"}'.encode("utf-16"),
    "utf16le.json": '{"model": "llama-3.2-1b"}'.encode("utf-16-le"),
    "utf32.json": '{"model": "llama-3.2-1b"}'.encode("utf-32"),
    "deep_list.json": b"[" * DEEP + b"]" * DEEP,
    "deep_object.json": b'{"a": ' * DEEP + b"1" + b"}" * DEEP,
    "deep_model.json": b'{"model": ' + b'{"a": ' * DEEP + b"1" + b"}" * DEEP + b"}",
    "deep_lora_500.json": b'{"lora": ' + b"[" * 500 + b"]" * 500 + b"}",
    "digits_seq_len.json": b'{"seq_len": ' + DIGITS.encode() + b"}",
    "digits_in_list.json": b'{"lora": {"targets": [' + DIGITS.encode() + b"]}}",
    "float_overflow.json": b'{"seq_len": 1e999}',
    "nan_seq_len.json": b'{"seq_len": NaN}',
    "nan_alpha.json": b'{"method": "lora", "lora": {"alpha": NaN}}',
    "infinite_gpu.json": b'{"gpu": {"memory_gib": Infinity}}',
    "empty.json": b"",
    "blank.json": b"  \n\t\n",
    "array.json": b'[{"model": "gpt2"}]',
    "null.json": b"null",
    "string.json": b'"llama-3.2-1b"',
    "number.json": b"42",
    "truncated.json": b'{"model": "gpt2"',
    "two_objects.json": b'{"model": "gpt2"} {"seq_len": 8}',
    "lone_surrogate.json": b'{"model": "\\ud800"}',
    "long_model.json": _obj({"model": "m" * 300}),
    "seq_len_1e30.json": _obj({"seq_len": 10**30}),
    "seq_len_true.json": _obj({"seq_len": True}),
    "micro_batch_2_5.json": _obj({"micro_batch_size": 2.5}),
    "lora_null.json": _obj({"method": "lora", "lora": None}),
    "parallel_string.json": _obj({"parallel": "tp=4"}),
}
HUGE = "huge.json"  # a sparse file one byte over the limit (read no further than the limit)
DIRECTORY = "a_directory.json"

#: (argv, stdin, substrings the one stderr line must hold: the field or flag, and what is allowed)
CASES = [
    # --- scenario files that are not UTF-8 JSON text
    ("binary", ["estimate", "@binary.json"], None, ["scenario", "binary file"]),
    ("latin-1", ["estimate", "@latin1.json"], None, ["scenario", "UTF-8", "0xe9"]),
    ("utf-16", ["estimate", "@utf16.json"], None, ["scenario", "UTF-16", "UTF-8"]),
    ("utf-16-le no BOM", ["recommend", "@utf16le.json"], None, ["scenario", "UTF-8"]),
    ("utf-32", ["plan", "@utf32.json"], None, ["scenario", "UTF-32", "UTF-8"]),
    ("binary on stdin", ["estimate", "-"], b"\x00\xff\xfe\x80", ["scenario", "stdin", "binary file"]),
    ("latin-1 on stdin", ["recommend", "-"], '{"gpu": "café"}'.encode("latin-1"), ["scenario", "UTF-8"]),
    # --- nesting, sizes and numbers JSON allows but no scenario needs
    ("nested lists", ["estimate", "@deep_list.json"], None, ["scenario", f"{MAX_JSON_DEPTH} levels"]),
    ("nested objects", ["plan", "@deep_object.json"], None, ["scenario", f"{MAX_JSON_DEPTH} levels"]),
    ("nested model", ["recommend", "@deep_model.json"], None, ["scenario", "levels"]),
    ("nested on stdin", ["estimate", "-"], b"[" * DEEP, ["scenario", "stdin", "levels"]),
    ("500 deep lora", ["estimate", "@deep_lora_500.json"], None, ["scenario", f"{MAX_JSON_DEPTH} levels"]),
    ("huge file", ["estimate", f"@{HUGE}"], None, ["scenario", "larger than", "MiB"]),
    ("5000-digit seq_len", ["estimate", "@digits_seq_len.json"], None, ["scenario", "digits"]),
    ("5000-digit list item", ["recommend", "@digits_in_list.json"], None, ["scenario", "digits"]),
    ("1e999", ["estimate", "@float_overflow.json"], None, ["seq_len", "integer"]),
    ("NaN seq_len", ["estimate", "@nan_seq_len.json"], None, ["seq_len", "integer"]),
    ("NaN lora alpha", ["estimate", "@nan_alpha.json"], None, ["lora.alpha", "finite"]),
    ("Infinity memory", ["estimate", "@infinite_gpu.json"], None, ["gpu.memory_gib", "finite"]),
    ("seq_len 10**30", ["estimate", "@seq_len_1e30.json"], None, ["seq_len", "<= 16,777,216"]),
    ("seq_len true", ["recommend", "@seq_len_true.json"], None, ["seq_len", "integer"]),
    ("micro-batch 2.5", ["estimate", "@micro_batch_2_5.json"], None, ["micro_batch_size", "integer"]),
    ("lora null", ["estimate", "@lora_null.json"], None, ["lora"]),
    ("parallel string", ["plan", "@parallel_string.json"], None, ["parallel"]),
    ("model name 300 chars", ["estimate", "@long_model.json"], None, ["model", "allowed"]),
    ("lone surrogate", ["estimate", "@lone_surrogate.json"], None, ["model", "allowed"]),
    # --- files that are not one JSON object
    ("missing file", ["estimate", "/no/such/dir/s.json"], None, ["scenario", "cannot read"]),
    ("directory", ["recommend", f"@{DIRECTORY}"], None, ["scenario", "cannot read"]),
    ("empty file", ["estimate", "@empty.json"], None, ["scenario", "is empty"]),
    ("blank file", ["plan", "@blank.json"], None, ["scenario", "is empty"]),
    ("empty stdin", ["estimate", "-"], b"", ["scenario", "stdin is empty"]),
    ("array", ["estimate", "@array.json"], None, ["scenario", "JSON object", "an array"]),
    ("null", ["recommend", "@null.json"], None, ["scenario", "JSON object, got null"]),
    ("string", ["estimate", "@string.json"], None, ["scenario", "JSON object"]),
    ("number", ["plan", "@number.json"], None, ["scenario", "JSON object"]),
    ("truncated", ["estimate", "@truncated.json"], None, ["scenario", "malformed JSON"]),
    ("two objects", ["estimate", "@two_objects.json"], None, ["scenario", "malformed JSON"]),
    # --- --headroom: a number in [0, 1) in every subcommand
    ("estimate headroom 1.0", ["estimate", "--headroom", "1.0"], None, ["--headroom", "[0, 1)"]),
    ("estimate headroom nan", ["estimate", "--headroom", "nan"], None, ["--headroom", "[0, 1)"]),
    ("estimate headroom 2", ["estimate", "--headroom", "2", "--json"], None, ["--headroom", "[0, 1)"]),
    ("estimate headroom -1", ["estimate", "--headroom", "-1"], None, ["--headroom", "[0, 1)"]),
    ("estimate headroom inf", ["estimate", "--headroom", "inf"], None, ["--headroom", "[0, 1)"]),
    ("estimate headroom 1e999", ["estimate", "--headroom", "1e999"], None, ["--headroom", "[0, 1)"]),
    ("estimate headroom 10%", ["estimate", "--headroom", "10%"], None, ["--headroom", "[0, 1)"]),
    ("recommend headroom nan", ["recommend", "--headroom", "nan"], None, ["--headroom", "[0, 1)"]),
    ("recommend headroom 1", ["recommend", "--headroom", "1"], None, ["--headroom", "[0, 1)"]),
    ("plan headroom inf", ["plan", "--headroom", "inf"], None, ["--headroom", "[0, 1)"]),
    ("plan headroom 1.0", ["plan", "--headroom", "1.0"], None, ["--headroom", "[0, 1)"]),
    # --- integer flags
    ("5000-digit --seq-len", ["estimate", "--seq-len", DIGITS], None, ["--seq-len", "integer", "digits"]),
    ("--seq-len 10**30", ["estimate", "--seq-len", str(10**30)], None, ["seq_len", "<= 16,777,216"]),
    ("--seq-len 1.5", ["recommend", "--seq-len", "1.5"], None, ["--seq-len", "integer"]),
    ("--dp 0", ["estimate", "--dp", "0"], None, ["parallel.dp", ">= 1"]),
    (
        "--micro-batch-size 10**9",
        ["estimate", "--micro-batch-size", "1000000000"],
        None,
        ["micro_batch_size"],
    ),
    ("--zero 7", ["estimate", "--zero", "7"], None, ["parallel.zero"]),
    ("--lora-rank 0", ["estimate", "--method", "lora", "--lora-rank", "0"], None, ["lora.rank", ">= 1"]),
    ("--top 5000 digits", ["plan", "--top", DIGITS], None, ["--top", "integer"]),
    ("plan --ep 5000 digits", ["plan", "--ep", DIGITS], None, ["space.ep", "comma list"]),
    ("--top -1", ["plan", "--top", "-1"], None, ["top", "positive"]),
    # --- --gpus of memsim plan: counts from 1 to 2**20
    ("--gpus 1-10**18", ["plan", "--gpus", f"1-{10**18}"], None, ["gpus", "1 to 1,048,576"]),
    ("--gpus 2**21", ["plan", "--gpus", str(2**21)], None, ["gpus", "1 to 1,048,576"]),
    ("--gpus list too big", ["plan", "--gpus", f"8,{10**30}"], None, ["gpus", "1 to 1,048,576"]),
    ("--gpus 5000 digits", ["plan", "--gpus", DIGITS], None, ["gpus", "LOW-HIGH"]),
    ("--gpus 1-2-3", ["plan", "--gpus", "1-2-3"], None, ["gpus", "LOW-HIGH"]),
    ("--gpus empty", ["plan", "--gpus", ""], None, ["gpus", "LOW-HIGH"]),
    ("--gpus 1,,2", ["plan", "--gpus", "1,,2"], None, ["gpus", "LOW-HIGH"]),
    ("--gpus 0-4", ["plan", "--gpus", "0-4"], None, ["gpus", "1 to 1,048,576"]),
    # --- a custom card: --gpu-memory GiB
    ("--gpu-memory 0", ["estimate", "--gpu-memory", "0"], None, ["gpu.memory_gib", "positive"]),
    ("--gpu-memory nan", ["estimate", "--gpu-memory", "nan"], None, ["gpu.memory_gib", "finite"]),
    ("--gpu-memory inf", ["recommend", "--gpu-memory", "inf"], None, ["gpu.memory_gib", "finite"]),
    ("--gpu-memory 48GB", ["estimate", "--gpu-memory", "48GB"], None, ["--gpu-memory", "GiB"]),
    ("--gpu-memory and --gpu", ["estimate", "--gpu", "h100", "--gpu-memory", "48"], None, ["--gpu-memory"]),
    ("--gpu-memory 1e30", ["plan", "--gpu-memory", "1e30"], None, ["gpu.memory_gib", "positive"]),
    # --- names and flags that do not exist
    ("--model 300 chars", ["estimate", "--model", "m" * 300], None, ["model", "allowed"]),
    ("--gpu unknown", ["estimate", "--gpu", "h900"], None, ["gpu", "allowed"]),
    ("unknown estimate flag", ["estimate", "--frobnicate"], None, ["--frobnicate"]),
    ("unknown plan flag", ["plan", "--bogus", "1"], None, ["--bogus"]),
    ("unknown recommend flag", ["recommend", "--json", "--seqlen", "8"], None, ["--seqlen"]),
    ("two scenario files", ["estimate", "@null.json", "@array.json"], None, ["unrecognized arguments"]),
    ("no subcommand", [], None, ["command"]),
    ("unknown subcommand", ["estimat"], None, ["estimat", "estimate"]),
]


def _write_files(tmp_path) -> None:
    for name, data in FILES.items():
        (tmp_path / name).write_bytes(data)
    with open(tmp_path / HUGE, "wb") as f:
        f.truncate(MAX_JSON_BYTES + 1)
    (tmp_path / DIRECTORY).mkdir()


def run(capsys, argv: list[str], stdin: bytes | None = None) -> tuple[int, str, str]:
    """``memsim argv`` in this process, stdin as real stdin is (bytes under a text layer)."""
    old = sys.stdin
    sys.stdin = io.TextIOWrapper(io.BytesIO(stdin or b""), encoding="utf-8")
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse exits by itself
        code = exc.code if isinstance(exc.code, int) else 1
    finally:
        sys.stdin = old
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize(
    ("source", "error"),
    [("def f(:\n", "SyntaxError"), ("raise RuntimeError('boom')\n", "RuntimeError: boom")],
)
def test_a_user_module_that_fails_to_import_is_one_line(capsys, tmp_path, source, error):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    path = tmp_path / "mine.py"
    path.write_text(source)
    code, out, err = run(capsys, ["trace", "--module", f"{path}:model", "--inputs", f"{path}:inputs"])
    assert code == 2 and out == "" and "Traceback" not in err
    lines = err.splitlines()
    assert len(lines) == 1 and "--module" in lines[0] and error in lines[0], err


def test_a_real_process_reads_binary_stdin_and_refuses_headroom_1():
    """Real stdin is bytes under a text layer: undecodable input is still one line, exit 2."""
    for argv, data, field in ((["-"], b"\xff\x00{", "scenario"), (["--headroom", "1.0"], b"", "--headroom")):
        proc = subprocess.run(
            [sys.executable, "-m", "memsim_widget.cli", "estimate", *argv],
            input=data,
            capture_output=True,
            check=False,
        )
        err = proc.stderr.decode()
        assert proc.returncode == 2 and proc.stdout == b"" and "Traceback" not in err
        assert len(err.splitlines()) == 1 and field in err, err


def test_the_table_is_large():
    assert len(CASES) >= 40
    assert len({name for name, *_ in CASES}) == len(CASES)


@pytest.mark.parametrize(("argv", "stdin", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_is_one_line_and_exit_2(capsys, tmp_path, argv, stdin, expected):
    _write_files(tmp_path)
    argv = [str(tmp_path / a[1:]) if a.startswith("@") else a for a in argv]
    code, out, err = run(capsys, argv, stdin)
    assert "Traceback" not in out + err
    assert code == 2, err
    assert out == ""
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("memsim: error: "), err
    assert len(lines[0]) < 400, lines[0]  # a 5000-digit value is cut, not echoed
    for text in expected:
        assert text in lines[0], lines[0]


# ----- the boundary refuses only nonsense ----------------------------------------------------------------


def estimate_json(capsys, *argv: str, stdin: bytes | None = None) -> dict:
    code, out, err = run(capsys, ["estimate", *argv, "--json"], stdin)
    assert code == 0 and err == "", err
    return json.loads(out)


def test_headroom_zero_and_half_are_used(capsys):
    zero = estimate_json(capsys, "--model", "gpt2", "--seq-len", "1024", "--headroom", "0")
    half = estimate_json(capsys, "--model", "gpt2", "--seq-len", "1024", "--headroom", "0.5")
    total = zero["device_total_bytes"]
    assert half["device_total_bytes"] == total
    assert zero["recommended_memory_bytes"] == total
    assert half["recommended_memory_bytes"] == 2 * total  # the peak with half the card kept free


def test_gpu_memory_is_a_custom_card_in_gib(capsys):
    data = estimate_json(capsys, "--model", "gpt2", "--seq-len", "1024", "--gpu-memory", "48")
    assert data["gpu_memory_bytes"] == 48 * GiB
    assert estimate_json(capsys, "--gpu-memory", "0.5")["gpu_memory_bytes"] == GiB // 2
    code, out, _ = run(capsys, ["estimate", "--model", "gpt2", "--seq-len", "1024", "--gpu-memory", "48"])
    assert code == 0 and "custom 48 GiB (48.00 GiB)" in out


def test_gpu_memory_in_plan_and_recommend(capsys):
    code, out, err = run(
        capsys, ["plan", "--model", "gpt2", "--seq-len", "1024", "--gpu-memory", "24", "--json"]
    )
    assert code == 0, err
    assert json.loads(out)["candidates"][0]["estimate"]["gpu_memory_bytes"] == 24 * GiB
    code, out, err = run(
        capsys, ["recommend", "--model", "gpt2", "--seq-len", "1024", "--gpu-memory", "24", "--json"]
    )
    assert code == 0, err
    assert json.loads(out)["gpu_memory_bytes"] == 24 * GiB


def test_a_utf8_bom_is_accepted(capsys, tmp_path):
    path = tmp_path / "bom.json"
    path.write_bytes(b"\xef\xbb\xbf" + _obj({"model": "gpt2", "seq_len": 64}))
    assert estimate_json(capsys, str(path))["scenario"]["seq_len"] == 64


def test_utf8_text_on_stdin_and_nested_configs_are_accepted(capsys, tiny_llama):
    nested = {**tiny_llama, "rope_scaling": {"rope_type": "linear", "factor": 2.0}}
    text = json.dumps({"model": nested, "gpu": {"memory_gib": 24, "name": "Käse-GPU"}}, ensure_ascii=False)
    data = estimate_json(capsys, "-", stdin=text.encode("utf-8"))
    assert data["gpu"]["name"] == "Käse-GPU" and data["gpu_memory_bytes"] == 24 * GiB


def test_gpu_counts_up_to_2_to_the_20_are_accepted():
    """The scenario's bound (MAX_GPUS = 2**20) is the CLI's: the largest count and range parse."""
    assert parse_gpus("1048576") == 2**20
    assert parse_gpus(" 1-1048576 ") == (1, 2**20)
    assert parse_gpus("8,16,1048576") == [8, 16, 2**20]
