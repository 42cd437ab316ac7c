"""The readers one by one: framework defaults, the torchtitan function read without running it, a tune run
line on a shipped config, the model by hub id or folder, and bad input as one error naming the file and key."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memsim_widget.cli import main
from memsim_widget.errors import ScenarioError
from memsim_widget.importers import import_config
from memsim_widget.importers.common import preset_for_hub_id

#: A torchtitan 0.3 config_registry function in the shape of torchtitan/models/llama3/config_registry.py
#: (written here, not copied): a Trainer.Config built from config dataclasses, edited by a second function.
TITAN = """
import os
from torchtitan.config import ActivationCheckpointConfig, ParallelismConfig, TrainingConfig
from torchtitan.trainer import Trainer
from . import model_registry

os.system("touch {marker}")  # never run: the reader interprets, it does not execute


def qwen3_base() -> Trainer.Config:
    return Trainer.Config(
        model_spec=model_registry("0.6B"),
        training=TrainingConfig(local_batch_size=4, seq_len=4096, global_batch_size=64),
        parallelism=ParallelismConfig(data_parallel_shard_degree=8, tensor_parallel_degree=2),
        activation_checkpoint=ActivationCheckpointConfig(mode="full"),
    )


def qwen3_job() -> Trainer.Config:
    config = qwen3_base()
    config.training.disable_cuda_graphs = True
    config.training.dtype = "bfloat16"
    return config
"""


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def test_a_torchtitan_function_is_read_with_ast_and_never_run(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    path = _write(tmp_path, "qwen3/config_registry.py", TITAN.format(marker=marker))
    sc = import_config(f"{path}:qwen3_job").scenario
    assert not marker.exists()
    assert (sc.model, sc.micro_batch_size, sc.seq_len, sc.precision) == ("qwen3-0.6b", 4, 4096, "bf16")
    assert (sc.parallel.dp, sc.parallel.tp, sc.parallel.zero) == (8, 2, 3)
    assert sc.grad_accum_steps == 64 // (4 * 8)  # torchtitan: global / (local x dp)
    assert sc.activation_checkpointing == "full" and sc.framework == "torchtitan"


def test_a_torchtitan_file_of_several_functions_needs_one_named(tmp_path: Path) -> None:
    path = _write(tmp_path, "qwen3/config_registry.py", TITAN.format(marker=tmp_path / "x"))
    with pytest.raises(ScenarioError, match=r"config_registry.py.*name one: FILE.py:FUNCTION"):
        import_config(path)


def test_a_tune_run_line_on_a_shipped_config_reads_the_name_and_the_overrides(tmp_path: Path) -> None:
    script = _write(tmp_path, "run.sh", "#!/bin/bash\ntune run --nproc_per_node 4 lora_finetune_distributed \\\n"
                    "  --config llama3_1/8B_lora batch_size=8 tokenizer.max_seq_len=4096 dataset.packed=True \\\n"
                    "  model.apply_lora_to_mlp=True model.lora_attn_modules=[q_proj,v_proj]\n")  # fmt: skip
    imported = import_config(script)
    sc = imported.scenario
    assert (sc.model, sc.method, sc.micro_batch_size, sc.seq_len, sc.padding) == (
        "llama-3.1-8b", "lora", 8, 4096, "packed")  # fmt: skip
    assert sc.lora.targets == ("q_proj", "v_proj", "down_proj", "gate_proj", "up_proj")
    assert (sc.parallel.dp, sc.parallel.zero, sc.framework) == (4, 3, "torchtune")
    # what the shipped config sets and no override does is listed, never assumed silently
    assert any(line.startswith("grad_accum_steps (--config llama3_1/8B_lora)") for line in imported.unread)


def test_transformers_defaults_fill_what_trainingarguments_leave_out(tmp_path: Path) -> None:
    path = _write(tmp_path, "args.json", json.dumps({"output_dir": "out", "bf16": True}))
    imported = import_config(path)
    sc = imported.scenario
    # transformers 5.24: per_device_train_batch_size 8, optim adamw_torch_fused
    assert (sc.micro_batch_size, sc.optimizer, sc.optimizer_impl) == (8, "adamw", "fused")
    keys = {line.split(" ")[0] for line in imported.unread}
    assert {"model", "seq_len", "precision", "parallel.dp", "gpu"} <= keys


def test_llamafactory_defaults_are_its_own(tmp_path: Path) -> None:
    path = _write(
        tmp_path, "lf.yaml", "model_name_or_path: meta-llama/Llama-3.2-1B\nstage: sft\ntemplate: llama3\n"
    )
    sc = import_config(path).scenario
    # finetuning_type lora, lora_rank 8, lora_alpha 2 x rank, lora_target all, cutoff_len 2048, checkpointing on
    assert (sc.method, sc.lora.rank, sc.lora.alpha, sc.lora.targets) == ("lora", 8, 16, ("all-linear",))
    assert (sc.seq_len, sc.activation_checkpointing, sc.micro_batch_size) == (2048, "full", 8)


def test_axolotl_defaults_are_its_schema_s(tmp_path: Path) -> None:
    from axolotl.utils.schemas.config import AxolotlInputConfig

    fields = AxolotlInputConfig.model_fields
    path = _write(tmp_path, "ax.yaml", "base_model: meta-llama/Llama-3.2-1B\n")
    sc = import_config(path).scenario
    assert sc.seq_len == fields["sequence_len"].default
    assert sc.micro_batch_size == fields["micro_batch_size"].default
    assert fields["optimizer"].default == "adamw_torch_fused" and sc.optimizer_impl == "fused"
    assert fields["bf16"].default == "auto" and sc.precision == "bf16"


def test_a_hub_id_maps_to_its_preset_and_a_folder_to_its_config(tmp_path: Path, tiny_llama: dict) -> None:
    assert preset_for_hub_id("meta-llama/Llama-3.1-8B") == ("llama-3.1-8b", "repo")
    assert preset_for_hub_id("NousResearch/Llama-3.2-1B") == ("llama-3.2-1b", "repo")  # a mirror, same name
    assert preset_for_hub_id("meta-llama/Llama-3.1-8B-Instruct")[0] == "llama-3.1-8b"
    assert preset_for_hub_id("someone/unknown-model") == (None, "")
    _write(tmp_path, "mymodel/config.json", json.dumps(tiny_llama))
    path = _write(tmp_path, "ax.yaml", "base_model: ./mymodel\n")
    assert import_config(path).scenario.model == str(tmp_path / "mymodel" / "config.json")


def test_an_unknown_model_is_listed_not_guessed(tmp_path: Path) -> None:
    path = _write(tmp_path, "ax.yaml", "base_model: someone/unknown-model\n")
    imported = import_config(path)
    assert any(line.startswith("model (ax.yaml: base_model)") for line in imported.unread)


@pytest.mark.parametrize(
    ("name", "text", "field"),
    [
        ("ax.yaml", "base_model: x\nmicro_batch_size: many\n", "ax.yaml: micro_batch_size"),
        ("ax.yaml", "base_model: x\nadapter: ia3\n", "ax.yaml: adapter"),
        ("ds_config.json", '{"zero_optimization": {"stage": 5}}', "ds_config.json: zero_optimization.stage"),
        ("ds_config.json", '{"zero_optimization": {"stage": 2', "ds_config.json"),
        (
            "ds_config.json",
            '{"zero_optimization": {"stage": 2, "overlap_comm": "yes"}}',
            "ds_config.json: zero_optimization.overlap_comm",
        ),
        (
            "ds_config.json",
            '{"zero_optimization": {"stage": 1, "reduce_bucket_size": 0}}',
            "ds_config.json: zero_optimization.reduce_bucket_size",
        ),
        (
            "ds_config.json",
            '{"zero_optimization": {"stage": 2, "reduce_bucket_size": "big"}}',
            "ds_config.json: zero_optimization.reduce_bucket_size",
        ),
        (
            "ds_config.json",
            '{"zero_optimization": {"stage": 2, "reduce_bucket_size": 1e13}}',
            "ds_config.json: zero_optimization.reduce_bucket_size",
        ),
        ("acc.yaml", "distributed_type: TPU\n", "acc.yaml: distributed_type"),
        ("lf.yaml", "stage: rm\ntemplate: x\n", "lf.yaml: stage"),
        ("job.toml", "[training]\nseq_len = 'long'\n", "job.toml: training.seq_len"),
        ("bad.yaml", "a: [1, 2\n", "bad.yaml"),
        ("list.yaml", "- 1\n- 2\n", "list.yaml"),
        ("what.yaml", "hello: world\n", "what.yaml"),
    ],
)
def test_bad_input_is_one_error_naming_the_file_and_key(
    tmp_path: Path, name: str, text: str, field: str
) -> None:
    path = _write(tmp_path, name, text)
    with pytest.raises(ScenarioError) as err:
        import_config(path)
    assert err.value.field == field
    assert "\n" not in str(err.value)


def test_zero12_reads_overlap_comm_and_reduce_bucket_size(tmp_path: Path) -> None:
    """ZeRO-1/2's overlap_comm and reduce_bucket_size become scenario keys (JSON's 2.5e8 a whole number of
    elements, "auto" kept for the engine: hidden_size x hidden_size; DeepSpeed's defaults leave them unset), not
    unread settings; under ZeRO-3 the bucket size stays listed as held at the default."""
    ds = {"zero_optimization": {"stage": 2, "overlap_comm": True, "reduce_bucket_size": 2.5e8}}
    imported = import_config(_write(tmp_path, "ds.json", json.dumps(ds)))
    p = imported.scenario.parallel
    assert (p.overlap_comm, p.reduce_bucket_size) == (True, 250_000_000)
    assert not any("reduce_bucket_size" in u or "overlap_comm" in u for u in imported.unread)
    ds["zero_optimization"] = {"stage": 1, "reduce_bucket_size": "auto"}
    p = import_config(_write(tmp_path, "ds.json", json.dumps(ds))).scenario.parallel
    assert (p.overlap_comm, p.reduce_bucket_size) == (None, "auto")
    ds["zero_optimization"] = {"stage": 2, "reduce_bucket_size": 5e8, "overlap_comm": False}
    p = import_config(_write(tmp_path, "ds.json", json.dumps(ds))).scenario.parallel
    assert (p.overlap_comm, p.reduce_bucket_size) == (None, None)  # DeepSpeed's defaults: the unset keys
    ds["zero_optimization"] = {"stage": 3, "reduce_bucket_size": "auto", "overlap_comm": True}
    imported = import_config(_write(tmp_path, "ds.json", json.dumps(ds)))
    assert imported.scenario.parallel.reduce_bucket_size is None
    assert any("reduce_bucket_size" in u for u in imported.unread)


def test_the_cli_prints_the_scenario_and_lists_the_unread_settings(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _write(tmp_path, "ax.yaml", "base_model: meta-llama/Llama-3.2-1B\nmicro_batch_size: 3\n")
    assert main(["import", str(path), "--gpu", "a100-80gb"]) == 0
    out, err = capsys.readouterr()
    data = json.loads(out)
    assert (data["model"], data["micro_batch_size"], data["gpu"]) == ("llama-3.2-1b", 3, "a100-80gb")
    assert "parallel.dp (ax.yaml)" in err and "[set by your flag]" in err


def test_estimate_plan_and_recommend_read_from_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _write(tmp_path, "ax.yaml", "base_model: meta-llama/Llama-3.2-1B\nmicro_batch_size: 3\n")
    assert main(["estimate", "--from", str(path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["scenario"]["micro_batch_size"] == 3
    assert main(["recommend", "--from", str(path), "--json"]) == 0
    capsys.readouterr()
    assert main(["plan", "--from", str(path), "--gpus", "1", "--top", "2", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)


def test_the_cli_exits_2_with_one_line_on_a_bad_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _write(tmp_path, "ax.yaml", "base_model: x\nsequence_len: -4\n")
    assert main(["import", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "ax.yaml: sequence_len" in err
    assert main(["estimate", "--from", str(path), str(path)]) == 2
    assert main(["estimate", str(path), "--from", str(path)]) == 2  # a scenario and --from: one or the other


def test_the_package_face_returns_the_scenario_and_the_unread_list(tmp_path: Path) -> None:
    import memsim_widget

    path = _write(tmp_path, "ax.yaml", "base_model: meta-llama/Llama-3.2-1B\n")
    scenario, unread = memsim_widget.import_config(path)
    assert scenario.model == "llama-3.2-1b" and all(isinstance(line, str) for line in unread)


def test_trainingarguments_json_as_transformers_writes_it(tmp_path: Path) -> None:
    """``TrainingArguments.to_json_string()`` (every key, transformers 5.24) reads to what was set."""
    transformers = pytest.importorskip("transformers")
    with pytest.warns(FutureWarning):  # gradient_checkpointing: 5.24's old name, still written
        args = transformers.TrainingArguments(output_dir=str(tmp_path / "out"), per_device_train_batch_size=4,
                                              bf16=True, gradient_checkpointing=True, use_cpu=True)  # fmt: skip
    path = _write(tmp_path, "training_args.json", args.to_json_string())
    sc = import_config(path).scenario
    # the file writes weight_decay 0.0 (the default): AdamW without decay is Adam (memsim's name; same memory)
    assert (sc.micro_batch_size, sc.activation_checkpointing, sc.optimizer, sc.optimizer_impl) == (
        4, "full", "adam", "fused")  # fmt: skip


def test_a_torchtune_config_alone_lists_the_gpu_count() -> None:
    data = Path(__file__).resolve().parents[1] / "data" / "configs" / "torchtune" / "8B_full.yaml"
    imported = import_config(data)
    assert imported.scenario.parallel.dp == 1
    assert any(
        line.startswith("parallel.dp (8B_full.yaml): tune run --nproc_per_node") for line in imported.unread
    )


def test_torchtitan_s_token_budget_form_reads_as_sequences(tmp_path: Path) -> None:
    """torchtitan main after 0.3: tokens per microbatch of sequences max_context_length long (arithmetic on
    constants evaluated, nothing else), packing datasets, ChunkedLossWrapper."""
    text = """
def llama3_job():
    model_spec = model_registry("8B")
    return Trainer.Config(
        model_spec=model_spec,
        loss=ChunkedLossWrapper.Config(loss_fn=CrossEntropyLoss.Config()),
        training=TrainingConfig(num_tokens_per_microbatch_per_dp_rank=2 * 8192, max_context_length=8192),
        dataloader=GrainDataLoader.Config(dataset=ConcatThenSplitPackingConfig(dataset=DATASETS["c4"])),
        parallelism=ParallelismConfig(data_parallel_shard_degree=4),
        activation_checkpoint=SelectiveAC.Config(),
    )
"""
    sc = import_config(_write(tmp_path, "llama3/config_registry.py", text)).scenario
    assert (sc.model, sc.micro_batch_size, sc.seq_len, sc.padding, sc.loss) == (
        "llama-3.1-8b", 2, 8192, "packed", "chunked")  # fmt: skip
    assert (sc.parallel.dp, sc.parallel.zero, sc.activation_checkpointing) == (4, 3, "selective-op")


def test_a_deepspeed_json_no_file_names_is_refused_not_dropped() -> None:
    data = Path(__file__).resolve().parents[1] / "data" / "configs"
    with pytest.raises(ScenarioError) as err:
        import_config([data / "axolotl" / "lora-1b.yml", data / "deepspeed" / "ds_z3_config.json"])
    assert err.value.field == "ds_z3_config.json" and "no other file names it" in err.value.message


def test_format_forces_how_the_files_are_read(tmp_path: Path) -> None:
    """``--format hf`` reads a YAML of TrainingArguments keys as such, whatever else it holds."""
    path = _write(tmp_path, "job.yaml", "base_model: x\nper_device_train_batch_size: 3\n")
    assert import_config(path).scenario.micro_batch_size == 1  # auto: axolotl (base_model), its default batch
    assert import_config(path, "hf").scenario.micro_batch_size == 3
    with pytest.raises(ScenarioError, match="--format"):
        import_config(path, "megatron")


def test_torchtitan_s_float8_converter_reads_as_its_fp8_recipe(tmp_path: Path) -> None:
    """torchtitan's ``model.converters = ["float8"]`` is torchao's float8 training; ``float8.recipe_name`` its
    scaling (torchao's default tensorwise); ``enable_fsdp_float8_all_gather`` is ``fp8_all_gather`` (tensorwise
    only, as torchao refuses it for rowwise)."""
    base = (Path(__file__).parent.parent / "data" / "configs" / "torchtitan" / "llama3_8b.toml").read_text()
    plain = import_config(_write(tmp_path, "plain.toml", base)).scenario
    assert plain.fp8_recipe is None
    text = base.replace('# converters = "float8"', 'converters = ["float8"]')
    assert import_config(_write(tmp_path, "tw.toml", text)).scenario.fp8_recipe == "tensorwise"
    text = text.replace("[float8]\n", '[float8]\nrecipe_name = "rowwise"\n').replace(
        "enable_fsdp_float8_all_gather = false", "enable_fsdp_float8_all_gather = true"
    )
    result = import_config(_write(tmp_path, "rw.toml", text))
    assert result.scenario.fp8_recipe == "rowwise" and result.scenario.fp8_all_gather is None
    assert any("fp8_all_gather" in u and "tensorwise" in u for u in result.unread)
    text = text.replace('recipe_name = "rowwise"\n', "")  # torchao gathers tensorwise weights in fp8
    assert import_config(_write(tmp_path, "ag.toml", text)).scenario.fp8_all_gather is True


def test_torchtitan_s_compile_components_say_whether_the_loss_is_compiled(tmp_path: Path) -> None:
    """``compile.components`` (torchtitan's ``["model", "loss"]`` by default) is ``compile_loss``; unlisted, the
    torchtitan profile's default (its loss compiled); a component torchtitan does not have is one line naming it."""
    base = (Path(__file__).parent.parent / "data" / "configs" / "torchtitan" / "llama3_8b.toml").read_text()
    on = base.replace("compile = false", "compile = true")
    assert import_config(_write(tmp_path, "on.toml", on)).scenario.compile_loss is None
    table = (
        base + '\n[compile]\nenable = true\ncomponents = ["model"]\n'
    )  # torchtitan's [compile] since mid-2025
    sc = import_config(_write(tmp_path, "model.toml", table)).scenario
    assert sc.compile and sc.compile_loss is False
    both = table.replace('["model"]', '["model", "loss"]')
    assert import_config(_write(tmp_path, "both.toml", both)).scenario.compile_loss is True
    assert (
        import_config(_write(tmp_path, "off.toml", table.replace("true", "false"))).scenario.compile_loss
        is None
    )
    with pytest.raises(ScenarioError, match=r"compile.components: must be a list of 'model' and 'loss'"):
        import_config(_write(tmp_path, "bad.toml", table.replace('["model"]', '["optimizer"]')))
