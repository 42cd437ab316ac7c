"""Hybrid sharding as each launch config says it, read into ``parallel.dp` x ``parallel.dp_shard``; what a file
cannot say (a node's GPU count, ZeRO++ hpZ) is listed, never guessed; exports write it back."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memsim_widget.export import export
from memsim_widget.importers import import_config
from memsim_widget.scenario import Scenario

TITAN_TOML = (Path(__file__).parent.parent / "data" / "configs" / "torchtitan" / "llama3_8b.toml").read_text()
ACCELERATE_FSDP = (Path(__file__).parent.parent / "data" / "configs" / "accelerate" / "fsdp.yaml").read_text()


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def _titan(replicate: int, shard: int) -> str:
    return TITAN_TOML.replace(
        "data_parallel_replicate_degree = 1", f"data_parallel_replicate_degree = {replicate}"
    ).replace("data_parallel_shard_degree = -1", f"data_parallel_shard_degree = {shard}")


def test_torchtitan_replicate_x_shard_is_dp_with_its_shard_degree(tmp_path: Path) -> None:
    """torchtitan's HSDP (data_parallel_replicate_degree 2 x data_parallel_shard_degree 4): 8 data-parallel
    GPUs, states sharded 4 ways; nothing listed as read otherwise."""
    got = import_config(_write(tmp_path, "hsdp.toml", _titan(2, 4)))
    p = got.scenario.parallel
    assert (p.dp, p.dp_shard, p.zero, p.shard_degree, p.dp_replicate) == (8, 4, 3, 4, 2)
    assert not any("HSDP" in u or "read as sharding" in u for u in got.unread)
    plain = import_config(_write(tmp_path, "fsdp.toml", _titan(1, 8))).scenario.parallel
    assert (plain.dp, plain.dp_shard) == (8, None)


def test_torchtitan_shard_minus_one_with_replicas_lists_the_gpu_count(tmp_path: Path) -> None:
    got = import_config(_write(tmp_path, "auto.toml", _titan(2, -1)))
    assert got.scenario.parallel.dp_shard is None
    assert any("HSDP" in u and "--dp-shard" in u for u in got.unread)


def test_torchtitan_hsdp_before_and_after() -> None:
    """The torchtitan HSDP example: llama 3.1 8B, 2 x 4, one micro-batch of 8,192 tokens. Read as 8-way
    sharding (before) the states took less than they do sharded 4 ways (now): an under-prediction."""
    base = {
        "model": "llama-3.1-8b",
        "framework": "torchtitan",
        "seq_len": 8192,
        "activation_checkpointing": "full",
    }
    now = Scenario.from_dict({**base, "parallel": {"dp": 8, "dp_shard": 4, "zero": 3}})
    before = Scenario.from_dict({**base, "parallel": {"dp": 8, "zero": 3}})
    from memsim_widget.engine.core import estimate

    assert estimate(now).device_total_bytes > estimate(before).device_total_bytes


@pytest.mark.parametrize(
    ("strategy", "zero"),
    [("HYBRID_SHARD", 3), ("_HYBRID_SHARD_ZERO2", 2), ("HYBRID_SHARD_ZERO2", 2), (4, 3), (5, 2)],
)
def test_accelerate_fsdp1_hybrid_shards_within_a_node(tmp_path: Path, strategy: str | int, zero: int) -> None:
    """FSDP1's hybrid strategies shard within a node (torch fsdp/api.py ShardingStrategy): num_processes is the
    job's total (accelerate 1.16.0 commands/launch.py), a node holds num_processes / num_machines."""
    text = ACCELERATE_FSDP.replace("num_processes: 2", "num_processes: 16\nnum_machines: 2").replace(
        "fsdp_sharding_strategy: FULL_SHARD", f"fsdp_sharding_strategy: {strategy}"
    )
    p = import_config(_write(tmp_path, "acc.yaml", text)).scenario.parallel
    assert (p.dp, p.dp_shard, p.zero) == (16, 8, zero)


def test_accelerate_hybrid_on_one_machine_is_full_sharding_and_says_so(tmp_path: Path) -> None:
    text = ACCELERATE_FSDP.replace(
        "fsdp_sharding_strategy: FULL_SHARD", "fsdp_sharding_strategy: HYBRID_SHARD"
    )
    got = import_config(_write(tmp_path, "acc.yaml", text))
    assert (got.scenario.parallel.dp, got.scenario.parallel.dp_shard) == (2, None)
    assert any("num_machines 1" in u for u in got.unread)


def test_accelerate_fsdp2_parallelism_config_sizes(tmp_path: Path) -> None:
    text = ACCELERATE_FSDP.replace("num_processes: 2", "num_processes: 8") + (
        "  fsdp_version: 2\nparallelism_config:\n  parallelism_config_dp_replicate_size: 2\n"
        "  parallelism_config_dp_shard_size: 4\n"
    )
    p = import_config(_write(tmp_path, "acc.yaml", text)).scenario.parallel
    assert (p.dp, p.dp_shard, p.zero) == (8, 4, 3)


def test_hf_trainer_hybrid_shard_lists_the_node_size(tmp_path: Path) -> None:
    args = {"per_device_train_batch_size": 1, "fsdp": "hybrid_shard auto_wrap"}
    got = import_config(_write(tmp_path, "args.json", json.dumps(args)), fmt="hf")
    assert got.scenario.parallel.dp_shard is None
    assert any("--dp-shard" in u for u in got.unread)


def test_deepspeed_mics_needs_the_dp_its_groups_tile(tmp_path: Path) -> None:
    """MiCS' mics_shard_size is the shard degree; a DeepSpeed JSON does not say the GPU count, so alone it is
    dropped and listed, with --dp it is read."""
    ds = {"zero_optimization": {"stage": 3, "mics_shard_size": 4}}
    path = _write(tmp_path, "ds.json", json.dumps(ds))
    alone = import_config(path)
    assert alone.scenario.parallel.dp_shard is None
    assert any("shard groups of 4" in u for u in alone.unread)
    given = import_config(path, overrides={"parallel": {"dp": 8}})
    assert (given.scenario.parallel.dp, given.scenario.parallel.dp_shard) == (8, 4)
    assert any("MiCS" in u for u in given.unread)


def test_deepspeed_hpz_is_listed_not_modelled(tmp_path: Path) -> None:
    ds = {"zero_optimization": {"stage": 3, "zero_hpz_partition_size": 8}}
    got = import_config(_write(tmp_path, "ds.json", json.dumps(ds)))
    assert got.scenario.parallel.dp_shard is None
    assert any("zero_hpz_partition_size" in u and "not modelled" in u for u in got.unread)


def test_axolotl_dp_shard_and_replicate_sizes(tmp_path: Path) -> None:
    text = (
        "base_model: meta-llama/Llama-3.2-1B\nfsdp_version: 2\nfsdp_config:\n  reshard_after_forward: true\n"
    )
    text += "dp_shard_size: 4\ndp_replicate_size: 2\n"
    p = import_config(_write(tmp_path, "ax.yaml", text)).scenario.parallel
    assert (p.dp, p.dp_shard, p.zero) == (8, 4, 3)


@pytest.mark.parametrize(
    ("fmt", "name"), [("torchtitan", "job.toml"), ("accelerate", "accelerate_config.yaml")]
)
def test_an_exported_hsdp_job_reads_back(tmp_path: Path, fmt: str, name: str) -> None:
    sc = Scenario.from_dict(
        {"model": "llama-3.1-8b", "framework": "torchtitan" if fmt == "torchtitan" else "hf",
         "parallel": {"dp": 8, "dp_shard": 4, "zero": 3}}
    )  # fmt: skip
    files = export(sc, fmt)
    for fname, text in files.items():
        (tmp_path / fname).write_text(text, encoding="utf-8")
    main_file = next(tmp_path / f for f in files if f.endswith((".toml", ".yaml", ".py")))
    p = import_config(main_file).scenario.parallel
    assert (p.dp, p.dp_shard, p.zero) == (8, 4, 3)
