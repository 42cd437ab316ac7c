"""torchtitan job config -> scenario keys: a 0.3 ``config_registry`` Python function (read with ``ast``, never
run) or an older release's TOML job file.

torchtitan 0.3 (torchtitan/config/configs.py ``TrainingConfig``, ``ParallelismConfig``, ``CompileConfig``,
``ActivationCheckpointConfig``; distributed/activation_checkpoint.py ``FullAC`` / ``SelectiveAC``;
components/loss.py ``ChunkedLossWrapper``; components/optimizer ``OptimizersInBackwardContainer``; later main's
``num_tokens_per_microbatch_per_dp_rank`` / ``max_context_length`` token budget and packing datasets) builds a
``Trainer.Config`` in a function; this reader interprets only literals, config constructors, ``config.a.b = v``
assignments, calls of the file's own functions and the optimizer's ``param_groups`` loop: any other statement is
ignored, nothing is imported or executed. TOML files (releases up to 0.2: ``[training] batch_size``,
``[activation_checkpoint] mode``/``selective_ac_option``) are read with ``tomllib``. Fields neither file nor
function sets take torchtitan's defaults, which memsim does not bundle: they are listed as unread.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

from memsim_widget.errors import ScenarioError
from memsim_widget.export.torchtitan import MODELS
from memsim_widget.importers.common import Reading, dig, file_error, get_bool, get_choice, get_int, get_str
from memsim_widget.rules.pipeline_split import split_style

#: (torchtitan model package, flavor) -> memsim preset (torchtitan's model_registry flavors).
FLAVORS: dict[tuple[str, str], str] = {
    ("llama3", "8B"): "llama-3.1-8b", ("llama3", "70B"): "llama-3.1-70b", ("llama3", "405B"): "llama-3.1-405b",
    ("qwen3", "0.6B"): "qwen3-0.6b", ("qwen3", "1.7B"): "qwen3-1.7b", ("qwen3", "14B"): "qwen3-14b",
    ("qwen3", "32B"): "qwen3-32b", ("qwen3", "30B-A3B"): "qwen3-30b-a3b", ("deepseek_v3", "671B"): "deepseek-v3",
    ("gpt_oss", "20b"): "gpt-oss-20b", ("gpt_oss", "120b"): "gpt-oss-120b",
}  # fmt: skip
SCHEDULES = {"1F1B": "1f1b", "GPipe": "gpipe", "Interleaved1F1B": "interleaved"}
DTYPES = {"bfloat16": "bfloat16", "float32": "float32"}
#: (training.dtype, mixed_precision_param) -> memsim precision (export/torchtitan.py PRECISION inverted).
PRECISION = {
    ("bfloat16", "bfloat16"): "bf16",
    ("float32", "bfloat16"): "amp-bf16",
    ("float32", "float32"): "fp32",
}
_MAX_DEPTH = 8
#: The integer arithmetic a config may write (``4 * 4096``); anything else stays uninterpreted.
_ARITHMETIC = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b,
               ast.FloorDiv: lambda a, b: a // b}  # fmt: skip


class Opaque:
    """A Python expression the reader does not interpret (its source text, for messages)."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return f"<{self.text}>"


def _name(node: ast.AST) -> str:
    """``a.b.c`` of a Name/Attribute chain ('' otherwise)."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _name(node.value)
        return f"{base}.{node.attr}" if base else ""
    return ""


class _Module:
    """The file's functions and imported names, and a small interpreter of config-building code."""

    def __init__(self, path: Path, tree: ast.Module) -> None:
        self.path = path
        self.functions = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
        self.imports: dict[str, str] = {}  # local name -> module it comes from
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                module = "." * node.level + (node.module or "")
                for a in node.names:
                    self.imports[a.asname or a.name] = module

    def value(self, node: ast.AST, env: dict[str, Any], depth: int) -> Any:
        if isinstance(node, ast.Constant):
            return node.value
        if (
            isinstance(node, ast.UnaryOp)
            and isinstance(node.op, ast.USub)
            and isinstance(node.operand, ast.Constant)
            and isinstance(node.operand.value, int | float | complex)
        ):
            return -node.operand.value
        if isinstance(node, ast.List | ast.Tuple):
            return [self.value(e, env, depth) for e in node.elts]
        if isinstance(node, ast.Dict):
            return {
                self.value(k, env, depth): self.value(v, env, depth)
                for k, v in zip(node.keys, node.values, strict=True)
                if k is not None
            }
        if isinstance(node, ast.Name):
            return env.get(node.id, Opaque(node.id))
        if isinstance(node, ast.BinOp) and type(node.op) in _ARITHMETIC:  # 4 * 4096: constants only
            left, right = self.value(node.left, env, depth), self.value(node.right, env, depth)
            if all(isinstance(x, int) and not isinstance(x, bool) and abs(x) < 2**40 for x in (left, right)):
                return (
                    _ARITHMETIC[type(node.op)](left, right)
                    if right or type(node.op) is not ast.FloorDiv
                    else 0
                )
        if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name):  # DATASETS["c4"]: a name
            return Opaque(ast.unparse(node)[:60])
        if isinstance(node, ast.Call):
            return self.call(node, env, depth)
        return Opaque(ast.unparse(node)[:60])

    def call(self, node: ast.Call, env: dict[str, Any], depth: int) -> Any:
        func = _name(node.func)
        if func in self.functions and not node.args and not node.keywords:
            return self.run(func, depth + 1)
        out: dict[str, Any] = {"__call__": func, "__args__": [self.value(a, env, depth) for a in node.args]}
        if func in self.imports and self.imports[func].endswith("config_registry"):
            out["__base__"] = (self.imports[func], func)
        for kw in node.keywords:
            if kw.arg is not None:
                out[kw.arg] = self.value(kw.value, env, depth)
        return out

    def run(self, name: str, depth: int = 0) -> Any:
        """The config a function of the file returns, interpreted statement by statement."""
        if depth > _MAX_DEPTH:
            raise file_error(self.path, name, "calls its own functions too deep to read")
        env: dict[str, Any] = {}
        for stmt in self.functions[name].body:
            if isinstance(stmt, ast.Return) and stmt.value is not None:
                return self.value(stmt.value, env, depth)
            if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
                self._assign(stmt.targets[0], self.value(stmt.value, env, depth), env)
            elif isinstance(stmt, ast.For) and isinstance(stmt.target, ast.Name):
                self._loop(stmt, env, depth)
        return None

    def _assign(self, target: ast.AST, value: Any, env: dict[str, Any]) -> None:
        dotted = _name(target)
        if not dotted:
            return
        root, *path = dotted.split(".")
        if not path:
            env[root] = value
            return
        obj = env.get(root)
        for part in path[:-1]:
            if not isinstance(obj, dict):
                return
            obj = obj.setdefault(part, {})
        if isinstance(obj, dict):
            obj[path[-1]] = value

    def _loop(self, stmt: ast.For, env: dict[str, Any], depth: int) -> None:
        """``for group in config.optimizer.param_groups: group.x = v`` sets ``optimizer.param_groups.x``."""
        source = _name(stmt.iter)
        var = stmt.target.id  # type: ignore[attr-defined]
        each: dict[str, Any] = {}
        for inner in stmt.body:
            if isinstance(inner, ast.Assign) and len(inner.targets) == 1:
                dotted = _name(inner.targets[0])
                if dotted.startswith(var + "."):
                    each[dotted[len(var) + 1 :]] = self.value(inner.value, env, depth)
        if source and each:
            self._assign(ast.parse(source, mode="eval").body, each, env)


def function_name(path: Path, module: _Module, wanted: str | None) -> str:
    """The function to read: the one named, the only one, or memsim's export function."""
    if wanted:
        if wanted not in module.functions:
            raise file_error(
                path, wanted, f"no such function; the file defines {', '.join(module.functions)}"
            )
        return wanted
    if len(module.functions) == 1:
        return next(iter(module.functions))
    if "memsim_job" in module.functions:
        return "memsim_job"
    raise file_error(path, "", f"defines {len(module.functions)} config functions ({', '.join(list(module.functions)[:8])}"
                     "); name one: FILE.py:FUNCTION")  # fmt: skip


def read_python(reading: Reading, path: Path, text: str, wanted: str | None = None) -> None:
    """A config_registry file: the chosen function's ``Trainer.Config``, read without running it."""
    try:
        tree = ast.parse(text, filename=path.name)
    except SyntaxError as exc:
        raise file_error(path, f"line {exc.lineno}", f"is not valid Python: {exc.msg}") from None
    module = _Module(path, tree)
    name = function_name(path, module, wanted)
    cfg = module.run(name)
    if not isinstance(cfg, dict):
        raise file_error(path, name, "does not return a config this reader can follow (Trainer.Config(...))")
    package = _package(path, module)
    _model(reading, path, cfg, package)
    read_fields(reading, path, cfg, f"{path.name}: {name}()", python=True)


def _package(path: Path, module: _Module) -> str:
    """The torchtitan model package of the file (``models/llama3/config_registry.py`` -> ``llama3``)."""
    source = module.imports.get("model_registry", "")
    if source.startswith("torchtitan.models."):
        return source.split(".")[2]
    return path.parent.name


def _model(reading: Reading, path: Path, cfg: dict[str, Any], package: str) -> None:
    """The preset: a base registry function memsim knows, or the model_registry flavor of the package."""
    base = cfg.get("__base__")
    if base:
        module, fn = base
        for preset, (pkg, name) in MODELS.items():
            if name == fn and module.endswith(f"models.{pkg}.config_registry"):
                reading.set("model", preset)
                reading.miss("config", f"{path.name}: {fn}()", f"fields set by torchtitan's {fn}() and not here are "
                             "not bundled: listed below as unread", keep=True)  # fmt: skip
                return
    spec = cfg.get("model_spec")
    flavor = spec.get("__args__", [None])[0] if isinstance(spec, dict) and spec.get("__args__") else None
    if flavor is not None and (package, flavor) in FLAVORS:
        reading.set("model", FLAVORS[(package, flavor)])
    else:
        reading.miss("model", f"{path.name}: model_spec", f"flavor {flavor!r} of {package!r} is no memsim preset; "
                     "pass --model")  # fmt: skip


def read_toml(reading: Reading, path: Path, data: dict[str, Any]) -> None:
    """An older torchtitan TOML job file (``[model] name/flavor``, ``[training] batch_size``...)."""
    name = get_str(path, data, "model.name", "")
    flavor = get_str(path, data, "model.flavor", "")
    if (name, flavor) in FLAVORS:
        reading.set("model", FLAVORS[(name, flavor)])
    else:
        reading.miss(
            "model", f"{path.name}: model.flavor", f"{name} {flavor} is no memsim preset; pass --model"
        )
    cfg = dict(data)
    training = dict(cfg.get("training") or {})
    if "batch_size" in training and "local_batch_size" not in training:
        training["local_batch_size"] = training["batch_size"]
    cfg["training"] = training
    if "compile" in training and not isinstance(cfg.get("compile"), dict):
        cfg["compile"] = {"enable": training["compile"]}
    read_fields(reading, path, cfg, path.name, python=False)


def read_fields(reading: Reading, path: Path, cfg: dict[str, Any], where: str, *, python: bool) -> None:
    """The Trainer.Config fields (a Python config or a TOML file, both as nested mappings)."""
    reading.set("framework", "torchtitan")
    reading.set("method", "full")

    def need(key: str, scenario_key: str) -> bool:
        if dig(cfg, key) is None:
            reading.miss(
                scenario_key, where, f"{key} not set: torchtitan's default applies; memsim assumed its own"
            )
            return False
        return True

    par = _parallel(reading, path, cfg, where)
    if dig(cfg, "training.num_tokens_per_microbatch_per_dp_rank") is not None:
        _token_batch(reading, path, cfg, where, par)
    else:
        _batch(reading, path, cfg, par, need)
    dataset = dig(cfg, "dataloader.dataset")
    if isinstance(dataset, dict) and "Packing" in str(dataset.get("__call__", "")):
        reading.set("padding", "packed")
    dtype = get_choice(path, cfg, "training.dtype", DTYPES, "float32")
    param = get_choice(path, cfg, "training.mixed_precision_param", DTYPES, "bfloat16")
    if (dtype, param) not in PRECISION:
        raise file_error(
            path, "training.dtype", f"{dtype} with mixed_precision_param {param} is not modelled"
        )
    reading.set("precision", PRECISION[(dtype, param)])
    if dig(cfg, "training.dtype") is None:
        reading.miss("precision", where, "training.dtype not set: read as float32 weights under bf16 FSDP mixed "
                     "precision (torchtitan's defaults)", keep=True)  # fmt: skip
    compiled = bool(get_bool(path, cfg, "compile.enable", False))
    reading.set("compile", compiled)
    _compile_components(reading, path, cfg, compiled)
    _optimizer(reading, path, cfg, where)
    _checkpointing(reading, path, cfg, where)
    loss = dig(cfg, "loss")
    chunked = isinstance(loss, dict) and str(loss.get("__call__", "")).startswith("ChunkedLossWrapper")
    reading.set("loss", "chunked" if chunked else "standard")
    if python and get_bool(path, cfg, "training.disable_cuda_graphs", False) is not True:
        reading.miss("training.disable_cuda_graphs", where, "torchtitan 0.3 captures the step in CUDA graphs by "
                     "default, which keeps the gradients allocated; memsim models the eager step (less memory)",
                     keep=True)  # fmt: skip
    _float8(reading, cfg, where)


def _compile_components(reading: Reading, path: Path, cfg: dict[str, Any], compiled: bool) -> None:
    """``compile.components`` (torchtitan ``config/configs.py``: ``["model", "loss"]`` by default) ->
    ``compile_loss``: whether the loss function is compiled apart too; unset, the profile's default (compiled)."""
    components = dig(cfg, "compile.components")
    if components is None or not compiled:
        return
    if not isinstance(components, list) or not all(c in ("model", "loss") for c in components):
        raise file_error(
            path, "compile.components", f"must be a list of 'model' and 'loss', got {components!r}"
        )
    reading.set("compile_loss", "loss" in components)


def _float8(reading: Reading, cfg: dict[str, Any], where: str) -> None:
    """torchao's float8 converter (``model.converters = ["float8"]``, or 0.3's ``model_converters``) ->
    ``fp8_recipe`` from ``float8.recipe_name`` (torchao's default: tensorwise); ``float8.enable_fsdp_float8_all_gather``
    (off by default) -> ``fp8_all_gather`` (docs/fidelity.md, "fp8")."""
    conv = dig(cfg, "model_converters")
    text = str(dig(cfg, "model.converters") or "") + str(conv or "")
    if "float8" not in text.lower():
        if conv is not None:
            reading.miss("fp8_recipe", where, f"model_converters {text[:60]!r} are not read", keep=True)
        return
    recipe = dig(cfg, "float8.recipe_name") or "tensorwise"
    if recipe in ("tensorwise", "rowwise"):
        reading.set("fp8_recipe", recipe)
    else:
        reading.miss("fp8_recipe", where, f"float8 recipe {recipe!r} is not modelled (tensorwise, rowwise)",
                     keep=True)  # fmt: skip
    if not dig(cfg, "float8.enable_fsdp_float8_all_gather"):
        return
    if recipe == "tensorwise":
        reading.set("fp8_all_gather", True)
    else:  # torchao's Float8LinearConfig refuses it: only tensorwise-scaled weights are gathered in fp8
        reading.miss("fp8_all_gather", where, f"enable_fsdp_float8_all_gather with recipe {recipe!r}: torchao "
                     "gathers tensorwise-scaled weights only", keep=True)  # fmt: skip


def _batch(reading: Reading, path: Path, cfg: dict[str, Any], par: dict[str, int], need: Any) -> None:
    """0.3's ``local_batch_size`` (pipeline microbatches of ``pipeline_parallel_microbatch_size``),
    ``global_batch_size`` (accumulation = global / (local x dp)) and ``seq_len``."""
    if need("training.local_batch_size", "micro_batch_size"):
        local = get_int(path, cfg, "training.local_batch_size")
        micro = (
            get_int(path, cfg, "parallelism.pipeline_parallel_microbatch_size", 1) if par["pp"] > 1 else local
        )
        if local % micro:
            raise file_error(
                path, "training.local_batch_size", f"{local} is not a multiple of the microbatch {micro}"
            )
        reading.set("micro_batch_size", micro)
        reading.set("parallel.pp_microbatches", local // micro)
        glob = get_int(path, cfg, "training.global_batch_size", -1, minimum=-1)
        if glob > 0 and par["dp"]:
            if glob % (local * par["dp"]):
                raise file_error(
                    path, "training.global_batch_size", f"{glob} is not a multiple of local batch x dp"
                )
            reading.set("grad_accum_steps", glob // (local * par["dp"]))
        else:
            reading.set("grad_accum_steps", 1)
    if need("training.seq_len", "seq_len"):
        reading.set("seq_len", get_int(path, cfg, "training.seq_len"))


def _token_batch(reading: Reading, path: Path, cfg: dict[str, Any], where: str, par: dict[str, int]) -> None:
    """Later releases' token budget: ``num_tokens_per_microbatch_per_dp_rank`` tokens of sequences
    ``max_context_length`` long (default 2048), ``num_tokens_per_train_step`` (-1: one microbatch per rank)."""
    tokens = get_int(path, cfg, "training.num_tokens_per_microbatch_per_dp_rank")
    length = get_int(path, cfg, "training.max_context_length", 2048)
    if tokens % length:
        raise file_error(path, "training.num_tokens_per_microbatch_per_dp_rank",
                         f"{tokens} tokens are not whole sequences of max_context_length {length}")  # fmt: skip
    reading.set("seq_len", length)
    reading.set("micro_batch_size", tokens // length)
    step = get_int(path, cfg, "training.num_tokens_per_train_step", -1, minimum=-1)
    if step > 0 and par["dp"]:
        if step % (tokens * par["dp"]):
            raise file_error(
                path, "training.num_tokens_per_train_step", "is not a multiple of microbatch tokens x dp"
            )
        reading.set("grad_accum_steps", step // (tokens * par["dp"]))
    elif step > 0:
        reading.miss("grad_accum_steps", where, "num_tokens_per_train_step needs the data-parallel size; memsim "
                     "assumed no accumulation")  # fmt: skip
    else:
        reading.set("grad_accum_steps", 1)
    if par["pp"] > 1:
        reading.miss("parallel.pp_microbatches", where, "the pipeline's microbatches follow the token budget; "
                     "pass --pp-microbatches")  # fmt: skip


def _parallel(reading: Reading, path: Path, cfg: dict[str, Any], where: str) -> dict[str, int]:
    """Degrees, FSDP or DDP, CPU offload, reshard, schedule; returns pp and the data-parallel size (0: unknown)."""
    g = {k: get_int(path, cfg, f"parallelism.{k}_degree", 1, minimum=-1) for k in
         ("data_parallel_replicate", "data_parallel_shard", "tensor_parallel", "context_parallel",
          "expert_parallel", "pipeline_parallel")}  # fmt: skip
    shard_given = dig(cfg, "parallelism.data_parallel_shard_degree") is not None
    shard = g["data_parallel_shard"] if shard_given else -1
    rep = g["data_parallel_replicate"]
    dp = 0
    if shard == -1:
        reading.set("parallel.zero", 3)
        hsdp = (
            f" (x data_parallel_replicate_degree {rep}: HSDP, pass --dp-shard GPUs/{rep})" if rep > 1 else ""
        )
        reading.miss("parallel.dp", where, "data_parallel_shard_degree -1 (the default): every GPU left over shards"
                     f"{hsdp}; the launch sets the count (pass --dp)")  # fmt: skip
    else:
        dp = max(rep, 1) * max(shard, 1)
        reading.set("parallel.dp", dp)
        reading.set("parallel.zero", 3 if shard > 1 else 0)
        if shard > 1 and rep > 1:  # HSDP: fully_shard over the (dp_replicate, dp_shard) mesh
            reading.set("parallel.dp_shard", shard)
    reading.set("parallel.tp", max(g["tensor_parallel"], 1))
    reading.set("parallel.cp", max(g["context_parallel"], 1))
    reading.set("parallel.ep", max(g["expert_parallel"], 1))
    pp = max(g["pipeline_parallel"], 1)
    reading.set("parallel.pp", pp)
    sp = get_bool(path, cfg, "parallelism.enable_sequence_parallel", True)
    reading.set("parallel.sequence_parallel", bool(sp) and g["tensor_parallel"] > 1)
    offload = get_bool(path, cfg, "training.enable_cpu_offload", False)
    reading.set("parallel.offload", "optimizer+params" if offload else "none")
    reshard = get_str(path, cfg, "parallelism.fsdp_reshard_after_forward", "default")
    reading.set("parallel.reshard_after_forward", reshard != "never")
    if pp > 1:
        sched = get_choice(path, cfg, "parallelism.pipeline_parallel_schedule", SCHEDULES, "1f1b")
        reading.set("parallel.pp_schedule", sched)
        _split(reading, path, cfg, where)
        per_stage = get_int(path, cfg, "parallelism.pipeline_parallel_layers_per_stage")
        if per_stage is not None:
            reading.miss("parallel.virtual_stages", where, f"layers per stage {per_stage}: memsim reads virtual "
                         "stages from --virtual-stages (layers / (pp x layers per stage))")  # fmt: skip
        elif sched == "interleaved":
            reading.miss(
                "parallel.virtual_stages",
                where,
                "interleaved without layers per stage: pass --virtual-stages",
            )
    return {"pp": pp, "dp": dp}


def _split(reading: Reading, path: Path, cfg: dict[str, Any], where: str) -> None:
    """The pipeline split: torchtitan counts the embedding and the head as ``first/last_stage_less_layers``
    layers (1 by default: ``parallel.pp_split`` torchtitan; 0 and 0: an even split; rules/pipeline_split)."""
    ends = tuple(
        get_int(path, cfg, f"parallelism.pipeline_parallel_{end}_stage_less_layers", 1, minimum=0)
        for end in ("first", "last")
    )
    if ends in ((0, 0), (1, 1)):
        wanted = "even" if ends == (0, 0) else "torchtitan"
        if wanted != _default_split(reading):  # said only where memsim's default would split otherwise
            reading.set("parallel.pp_split", wanted)
    else:
        reading.miss("parallel.pp_split", where, f"first/last stage less layers {ends[0]}/{ends[1]}: memsim "
                     "splits as torchtitan does with 1/1 (its default) or 0/0")  # fmt: skip


def _default_split(reading: Reading) -> str | None:
    """The split style memsim gives the model read so far without ``pp_split`` (virtual stages from memsim's
    note when the file carries one, else 1); None where the model is not known."""
    from memsim_widget.catalog.models import architecture_for

    par = (reading.note or {}).get("parallel") or {}
    try:
        layers = architecture_for(reading.values.get("model") or "").num_layers
    except (ScenarioError, KeyError, ValueError):
        return None
    chunks = int(reading.values.get("parallel.pp", 1)) * int(par.get("virtual_stages") or 1)
    return split_style(None, layers, chunks)


def _optimizer(reading: Reading, path: Path, cfg: dict[str, Any], where: str) -> None:
    """Optimizer name (``param_groups``' ``optimizer_name`` or TOML ``optimizer.name``), kernel, in-backward."""
    opt = dig(cfg, "optimizer")
    kind = str(opt.get("__call__", "")) if isinstance(opt, dict) else ""
    in_bwd = kind.startswith("OptimizersInBackwardContainer")  # a Python config names the container
    reading.set(
        "optimizer_in_backward",
        in_bwd or bool(get_bool(path, cfg, "optimizer.early_step_in_backward", False)),
    )
    name = dig(cfg, "optimizer.param_groups.optimizer_name") or dig(cfg, "optimizer.name") or "AdamW"
    table = {"AdamW": "adamw", "Adam": "adam"}
    if name not in table:
        reading.miss("optimizer", where, f"{name!r} is not modelled; memsim assumed AdamW")
    else:
        reading.set("optimizer", table[name])
    impl = get_choice(path, cfg, "optimizer.implementation", {"foreach": "foreach", "fused": "fused",
                      "for-loop": "for-loop"}, "fused")  # fmt: skip
    reading.set("optimizer_impl", impl)


def _checkpointing(reading: Reading, path: Path, cfg: dict[str, Any], where: str) -> None:
    """``activation_checkpoint``: FullAC / SelectiveAC / None (0.3), or ``mode`` + ``selective_ac_option``."""
    ac = dig(cfg, "activation_checkpoint", Opaque("unset"))
    if isinstance(ac, Opaque):
        reading.miss(
            "activation_checkpointing", where, "not set: torchtitan's default applies; memsim assumed none"
        )
        return
    call = str(ac.get("__call__", "")) if isinstance(ac, dict) else ""
    mode = (
        "none"
        if ac is None
        else (
            "full" if call.startswith("FullAC") else ("selective" if call.startswith("SelectiveAC") else None)
        )
    )
    if mode is None:
        mode = get_choice(path, cfg, "activation_checkpoint.mode", {"none": "none", "full": "full",
                          "selective": "selective", "memory_budget": "memory_budget"}, "none")  # fmt: skip
    if mode == "memory_budget":
        reading.miss(
            "activation_checkpointing",
            where,
            "memory_budget (compile's) is not modelled; memsim assumed full",
            keep=True,
        )
        mode = "full"
    if mode != "selective":
        reading.set("activation_checkpointing", mode)
        return
    option = str(dig(cfg, "activation_checkpoint.selective_ac_option", "op"))
    if option == "op":
        reading.set("activation_checkpointing", "selective-op")
    elif option.isdigit() and int(option) >= 1:
        reading.set("activation_checkpointing", "full")
        if int(option) > 1:
            reading.set("checkpoint_every", int(option))
    else:
        raise file_error(
            path,
            "activation_checkpoint.selective_ac_option",
            f"must be 'op' or a positive integer, got {option!r}",
        )
