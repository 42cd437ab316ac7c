"""Launch-config import: the user's own files (axolotl, LLaMA-Factory, torchtune, torchtitan, accelerate +
DeepSpeed, HF TrainingArguments) read back as a scenario, one module per framework.

``import_config(paths)`` returns an ``Imported``: the scenario, and every memory setting the files did not give
(the GPU type, the launcher's GPU count, a script's sequence length...) as one line each, with what memsim
assumed; nothing is dropped silently. Each reader follows its framework's documented keys and defaults for the
release its docstring names. A file memsim exported carries its scenario in the provenance note: the note fills
what the format cannot say, and the file's own keys win over it. Nothing is downloaded or executed.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import field
from pathlib import Path
from typing import Any

from memsim_widget.errors import ScenarioError, choice_error
from memsim_widget.fast_dataclass import dataclass
from memsim_widget.importers import accelerate, axolotl, deepspeed, hf, llamafactory, torchtitan, torchtune
from memsim_widget.importers.common import Reading, Unread, file_error, load_mapping, memsim_note, read_text
from memsim_widget.optimizers import OPTIMIZERS
from memsim_widget.rules.model import available_impl
from memsim_widget.scenario import DEFAULTS, Scenario

#: The formats ``memsim import --format`` names (``auto`` detects each file's).
FORMATS = ("deepspeed", "accelerate", "hf", "axolotl", "llamafactory", "torchtune", "torchtitan")
#: What no launch config says: the card.
GPU_UNREAD = Unread(
    "gpu",
    "every file",
    "no launch config names the GPU type; memsim assumed its default (--gpu, or the GPU control)",
)


@dataclass
class Imported:
    """The scenario read from launch configs, the settings left unread (one line each), and each file's format.
    Unpacks as ``scenario, unread = import_config(paths)``."""

    scenario: Scenario
    unread: list[str]
    formats: dict[str, str] = field(default_factory=dict)

    def __iter__(self) -> Iterator[Any]:
        return iter((self.scenario, self.unread))

    def to_dict(self) -> dict[str, Any]:
        return {
            "scenario": self.scenario.to_dict(),
            "unread": list(self.unread),
            "formats": dict(self.formats),
        }


@dataclass
class _File:
    path: Path
    text: str
    kind: str  # a format, or "model" (an HF config.json), or "setup" (memsim's hf model_setup.yaml)
    data: dict[str, Any] | None = None
    function: str | None = None  # torchtitan: the config function named as FILE.py:FUNCTION


def detect(path: Path, text: str, data: dict[str, Any] | None) -> str:
    """A file's format from its name and keys (``model`` for an HF config.json)."""
    suffix = path.suffix.lower()
    if suffix == ".py":
        return "torchtitan"
    if suffix == ".toml":
        return "torchtitan"
    if data is None:
        if torchtune.looks_like_script(text):
            return "torchtune"
        raise file_error(path, "", "is not a launch config memsim reads (JSON, YAML, TOML, a torchtitan .py or a "
                         "tune run script)")  # fmt: skip
    if "model_type" in data and not deepspeed.looks_like(data):
        return "model"
    checks = (
        ("deepspeed", deepspeed.looks_like),
        ("accelerate", accelerate.looks_like),
        ("torchtune", torchtune.looks_like_config),
        ("llamafactory", llamafactory.looks_like),
        ("axolotl", axolotl.looks_like),
        ("setup", hf.is_model_setup),
        ("hf", hf.is_training_args),
    )
    for kind, test in checks:
        if test(data):
            return kind
    raise file_error(
        path, "", "has none of the keys of the formats memsim reads (" + ", ".join(FORMATS) + ")"
    )


def _load(spec: str | Path) -> _File:
    """Read one file (``FILE.py:FUNCTION`` picks a torchtitan function) and parse what is a mapping."""
    text_spec, function = str(spec), None
    path = Path(text_spec)
    if not path.exists() and ".py:" in text_spec:
        head, _, function = text_spec.rpartition(":")
        path = Path(head)
    text = read_text(path)
    data = None
    if path.suffix.lower() in (".json", ".yaml", ".yml", ".toml"):
        data = load_mapping(path, text)
    elif path.suffix.lower() not in (".py", ".sh") and not torchtune.looks_like_script(text):
        data = load_mapping(path, text)  # YAML without the suffix
    return _File(path, text, detect(path, text, data), data, function)


def _companion(files: list[_File]) -> Any:
    """The lookup a reader uses for a file it names (a DeepSpeed JSON): among the given files, else beside it."""

    def find(origin: Path, name: str) -> tuple[Path, dict[str, Any]] | None:
        for f in files:
            if f.kind == "deepspeed" and (f.path.name == Path(name).name):
                f.kind = "deepspeed-used"
                return f.path, f.data or {}
        for base in (origin.parent, Path.cwd()):  # beside the config, then where the launch runs
            candidate = (base / name).expanduser()
            if candidate.is_file():
                return candidate, load_mapping(candidate, read_text(candidate))
        return None

    return find


def _read_primary(reading: Reading, f: _File, files: list[_File]) -> None:
    """Dispatch one file to its reader."""
    find = _companion(files)
    data = f.data or {}
    if f.kind == "deepspeed":
        deepspeed.read(reading, f.path, data)
    elif f.kind == "accelerate":
        accelerate.read(reading, f.path, data, find)
    elif f.kind == "axolotl":
        axolotl.read(reading, f.path, data, find)
    elif f.kind == "llamafactory":
        llamafactory.read(reading, f.path, data, find)
    elif f.kind == "torchtune":
        if f.data is None:
            torchtune.read_script(reading, f.path, f.text)
        else:
            torchtune.read_config(reading, f.path, data)
    elif f.kind == "torchtitan":
        if f.path.suffix.lower() == ".py":
            torchtitan.read_python(reading, f.path, f.text, f.function)
        else:
            torchtitan.read_toml(reading, f.path, data)
    else:
        raise file_error(f.path, "", f"cannot be read as {f.kind}")


def _read_hf(reading: Reading, files: list[_File]) -> None:
    """TrainingArguments, memsim's model_setup.yaml, and the DeepSpeed JSON the arguments name."""
    args = next((f for f in files if f.kind == "hf"), None)
    setup = next((f for f in files if f.kind == "setup"), None)
    flags: dict[str, Any] = {"bf16": False, "fp16": False, "deepspeed": None}
    if args is not None:
        flags = hf.read_args(reading, args.path, args.data or {})
    else:
        reading.miss("micro_batch_size", "TrainingArguments", "no TrainingArguments file given")
    dtype = flags.get("dtype")
    if setup is not None:
        dtype = hf.read_setup(reading, setup.path, setup.data or {}) or dtype
    elif "model" not in reading.values:
        for key in ("model", "method", "attention"):
            reading.miss(
                key,
                "your script",
                "from_pretrained / PEFT are set in your script; memsim assumed its default",
            )
    if "seq_len" not in reading.values:
        reading.miss("seq_len", "your script", "the tokenizer/collator sets it; memsim assumed its default")
    ds = False
    ref = flags["deepspeed"]
    if isinstance(ref, dict):
        deepspeed.read(reading, args.path if args else Path("TrainingArguments"), ref)
        ds = True
    elif isinstance(ref, str) and args is not None:
        found = _companion(files)(args.path, ref)
        if found is None:
            reading.miss("parallel.zero", f"{args.path.name}: deepspeed", f"{ref!r} was not given and is not beside "
                         "the file: pass it too")  # fmt: skip
        else:
            micro = reading.values.get("micro_batch_size")
            deepspeed.read(reading, *found)
            reading.files.append(found[0])
            _check_same(
                found[0], "train_micro_batch_size_per_gpu", micro, reading.values.get("micro_batch_size")
            )
            ds = True
    if not ds and "parallel.zero" not in reading.values:
        reading.set("parallel.zero", 0)
        reading.set("parallel.offload", "none")
    if "parallel.dp" not in reading.values:
        reading.miss("parallel.dp", "the launcher", "torchrun --nproc-per-node sets the GPU count; memsim assumed one "
                     "(pass --dp)")  # fmt: skip
    where = setup.path.name if setup else (args.path.name if args else "hf")
    hf.precision(reading, where, dtype, flags, ds)


def _check_same(path: Path, key: str, before: Any, after: Any) -> None:
    """The HF integration refuses a DeepSpeed value that contradicts the Trainer's (hf_deepspeed_config)."""
    if before is not None and after is not None and before != after:
        raise file_error(
            path, key, f"{after} contradicts the TrainingArguments' {before} (the Trainer refuses it)"
        )


def _format_of(files: list[_File], fmt: str) -> str:
    """The format the files are read as: the forced one, else the first primary file's."""
    kinds = [f.kind for f in files if f.kind not in ("model", "deepspeed")]
    if fmt != "auto":
        if fmt not in FORMATS:
            raise choice_error("--format", fmt, ("auto", *FORMATS))
        return fmt
    if not kinds:
        return "deepspeed" if any(f.kind == "deepspeed" for f in files) else "model"
    primary = "hf" if kinds[0] == "setup" else kinds[0]
    for f, k in (
        (f, "hf" if f.kind == "setup" else f.kind) for f in files if f.kind not in ("model", "deepspeed")
    ):
        if k != primary:
            raise file_error(
                f.path, "", f"reads as {k} but {files[0].path.name} as {primary}: give one job's files"
            )
    return primary


def read_files(paths: Sequence[str | Path], fmt: str = "auto") -> Reading:
    """The combined reading of one job's files (nothing resolved into a scenario yet)."""
    if not paths:
        raise ScenarioError("FILE", "give at least one launch config file")
    files = [_load(p) for p in paths]
    chosen = _format_of(files, fmt)
    if (
        fmt != "auto"
    ):  # --format: every file but a DeepSpeed JSON or a model config.json is read as that format
        for f in files:
            if f.kind not in ("model", "deepspeed"):
                f.kind = "setup" if chosen == "hf" and hf.is_model_setup(f.data or {}) else chosen
    reading = Reading(chosen)
    reading.files = [f.path for f in files]
    if chosen == "hf":
        _read_hf(reading, files)
    elif chosen != "model":
        primaries = [f for f in files if f.kind not in ("model", "setup", "deepspeed")]
        if len(primaries) > 1:
            raise file_error(primaries[1].path, "", f"a second {chosen} file: give one job's files")
        main = primaries[0] if primaries else next(f for f in files if f.kind == "deepspeed")
        _read_primary(reading, main, files)
        main.kind = "deepspeed-used" if main.kind == "deepspeed" else main.kind
    for f in files:  # a DeepSpeed JSON no file names would be dropped silently: refused instead
        if f.kind == "deepspeed" and chosen not in ("model",):
            raise file_error(f.path, "", "no other file names it (their deepspeed key): add it there, or give "
                             "it alone")  # fmt: skip
    for f in files:
        if f.kind == "model":  # a model's own config.json given beside the launch files: it is the model
            reading.set("model", str(f.path))
        note = memsim_note(f.text) or _sibling_note(f.path)
        if note is not None and reading.note is None:
            reading.note = note
    return reading


def _sibling_note(path: Path) -> dict[str, Any] | None:
    """memsim's note beside a JSON export (``ds_config.memsim.txt``)."""
    side = path.with_suffix(".memsim.txt")
    if path.suffix.lower() == ".json" and side.is_file():
        return memsim_note(read_text(side))
    return None


def _nest(values: Mapping[str, Any]) -> dict[str, Any]:
    """Dotted keys as nested mappings."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        *parents, leaf = key.split(".")
        target = out
        for p in parents:
            target = target.setdefault(p, {})
        target[leaf] = value
    return out


def _merge(base: dict[str, Any], top: Mapping[str, Any]) -> dict[str, Any]:
    """``top`` over ``base``, nested mappings merged key by key."""
    out = dict(base)
    for k, v in top.items():
        out[k] = _merge(out[k], v) if isinstance(v, Mapping) and isinstance(out.get(k), dict) else v
    return out


#: Scenario keys a reader may set that are not scenario keys (the unread list's framework keys never are).
_SCENARIO_ROOTS = {"model", "method", "lora", "precision", "optimizer", "optimizer_impl", "optimizer_in_backward",
                   "micro_batch_size", "seq_len", "grad_accum_steps", "activation_checkpointing", "checkpoint_every",
                   "attention", "loss", "framework", "compile", "activation_offloading", "padding", "parallel",
                   "gpu", "objective", "rl", "fp8_recipe", "fp8_all_gather", "compile_loss"}  # fmt: skip


def scenario_dict(
    reading: Reading, overrides: Mapping[str, Any] | None = None, use_note: bool = True
) -> dict[str, Any]:
    """The scenario JSON of a reading: assumed values, then memsim's note, then the files' keys, then overrides."""
    data = _merge({}, _nest(reading.assumed))
    if use_note and reading.note:
        note = {k: v for k, v in reading.note.items() if k != "num_gpus"}
        data = _merge(data, note)
    data = _merge(
        data, _nest({k: v for k, v in reading.values.items() if k.split(".")[0] in _SCENARIO_ROOTS})
    )
    data = _merge(data, overrides or {})
    _unknown_dp_shard(reading, data, overrides or {})
    opt = data.get("optimizer")
    if (
        isinstance(opt, str) and opt in OPTIMIZERS
    ):  # an optimizer of one kernel (bitsandbytes') gets that kernel
        data["optimizer_impl"] = available_impl(opt, data.get("optimizer_impl", DEFAULTS["optimizer_impl"]))
    return data


def _unknown_dp_shard(reading: Reading, data: dict[str, Any], overrides: Mapping[str, Any]) -> None:
    """A shard degree read (``parallel.dp_shard``: MiCS, a node's GPUs) where no file nor flag says the
    data-parallel size it must divide: dropped (the scenario's one GPU shards nothing) and listed."""
    par = data.get("parallel")
    if not isinstance(par, dict) or par.get("dp_shard") is None:
        return
    given = "parallel.dp" in reading.values or "dp" in (overrides.get("parallel") or {})
    dp = par.get("dp", 1)
    if not given and isinstance(dp, int) and isinstance(par["dp_shard"], int) and dp % par["dp_shard"]:
        reading.miss("parallel.dp_shard", "parallel.dp", f"shard groups of {par['dp_shard']} need the data-parallel "
                     "size, which the launch sets: dropped; pass --dp (a multiple of it) and --dp-shard",
                     keep=True)  # fmt: skip
        del par["dp_shard"]


def unread_lines(
    reading: Reading,
    overrides: Mapping[str, Any] | None = None,
    use_note: bool = True,
    given_by: str = "your flag",
) -> list[str]:
    """The unread settings, one line each: the ones no file set; those memsim's note or a flag gave say so."""
    given = set(reading.values)
    flat_over = set(_flatten(overrides or {}))
    note = set(_flatten(reading.note or {})) if use_note else set()
    lines, seen = [], set()
    for u in [*reading.unread, GPU_UNREAD]:
        if (u.key in given and not u.keep and u.key not in reading.assumed) or (u.key, u.keep) in seen:
            continue
        seen.add((u.key, u.keep))
        line = u.line()
        if u.key in flat_over or any(k.startswith(u.key + ".") for k in flat_over):
            line += f" [set by {given_by}]"
        elif not u.keep and (u.key in note or any(k.startswith(u.key + ".") for k in note)):
            line += " [taken from memsim's note in the file]"
        lines.append(line)
    return lines


def _flatten(data: Mapping[str, Any], prefix: str = "") -> list[str]:
    out = []
    for k, v in data.items():
        key = f"{prefix}{k}"
        out.append(key)
        if isinstance(v, Mapping):
            out += _flatten(v, key + ".")
    return out


def import_config(paths: str | Path | Sequence[str | Path], fmt: str = "auto",
                  overrides: Mapping[str, Any] | None = None, given_by: str = "your flag") -> Imported:  # fmt: skip
    """Read one job's launch config files as a scenario (``overrides``: scenario keys set on top, as the CLI's
    flags, which the unread lines say were ``given_by``); bad input raises ``ScenarioError`` naming the file
    and key."""
    if isinstance(paths, str | Path):
        paths = [paths]
    reading = read_files(list(paths), fmt)
    reading.files = list(dict.fromkeys(reading.files))  # a DeepSpeed JSON found by name may be given too
    data = scenario_dict(reading, overrides)
    try:
        scenario = Scenario.from_dict(data)
    except ScenarioError as exc:
        where = ", ".join(p.name for p in reading.files)
        raise ScenarioError(f"{where}: {exc.field}", exc.message) from None
    formats = {str(p): reading.fmt for p in reading.files}
    return Imported(scenario, unread_lines(reading, overrides, given_by=given_by), formats)


__all__ = ["FORMATS", "Imported", "detect", "import_config", "read_files", "scenario_dict"]
