"""Whether this tree's estimates are byte-identical to a git revision's, over a grid of scenarios.

A speed change to the engine (the allocator's replay, the stream's building, a cache) must not move a figure: this
estimates ``--count`` seeded random scenarios (10 model families, five precisions, micro-batch 1 to 8, 128 to 4,096
tokens, no, full and selective checkpointing, full training, LoRA and QLoRA, one GPU, DDP, ZeRO-1/2/3, FSDP2, tensor
and pipeline parallel, five frameworks, four cards, gradient accumulation, the replay and the fitted reserved
counter, and six ``allocator_conf`` settings: expandable segments, ``max_split_size_mb``, power-of-two
divisions, garbage collection) and three ``plan`` searches (the planner's vector path), in this tree and in
REV's (``git archive`` into a temporary folder, imported with ``PYTHONPATH``, each in a fresh process), and
compares the SHA-256 of each estimate's ``repr`` (an invalid scenario: its error's text) and of each plan's
columns. Exits 1 on any difference and names the scenarios.

Run: python benchmarks/estimate_identity.py --vs main [--count 400]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

MODELS = (
    "llama-3.2-1b",
    "llama-3.1-8b",
    "qwen2.5-0.5b",
    "qwen2.5-7b",
    "gpt2",
    "mixtral-8x7b",
    "gemma-3-1b",
    "olmo-2-1b",
    "bert-base-uncased",
    "qwen3-0.6b",
)
#: one GPU and ZeRO-3 / FSDP2 more often: the layouts the replay models most (the others often take the fitted rule)
PARALLEL: tuple[dict[str, int], ...] = (
    {},
    {},
    {},
    {},
    {"dp": 2},
    {"dp": 8, "zero": 3},
    {"dp": 8, "zero": 3},
    {"dp": 4, "zero": 1},
    {"dp": 4, "zero": 2},
    {"dp": 2, "tp": 2},
    {"tp": 2},
    {"pp": 2, "pp_microbatches": 4},
    {"dp": 4, "zero": 3, "tp": 2},
)
FRAMEWORKS = (None, "torchtitan", "deepspeed", "torchtune", "hf")
ALLOC_CONFS = (
    None,
    "expandable_segments:True",
    "max_split_size_mb:128",
    "roundup_power2_divisions:4",
    "garbage_collection_threshold:0.8",
    "expandable_segments:True,max_split_size_mb:256",
)
PLANS = (("llama-3.2-1b", "h100-80gb", 1), ("qwen2.5-0.5b", "rtx-4090", 2), ("llama-3.1-8b", "a100-80gb", 4))


def scenarios(n: int, seed: int = 0) -> Iterator[dict[str, Any]]:
    """``n`` seeded random scenarios (some invalid: their errors are compared too)."""
    rng = random.Random(seed)
    for _ in range(n):
        d: dict[str, Any] = {
            "model": rng.choice(MODELS),
            "micro_batch_size": rng.choice([1, 2, 3, 4, 8]),
            "seq_len": rng.choice([128, 512, 1000, 1024, 2048, 4096]),
            "precision": rng.choice(["bf16", "amp-bf16", "fp32", "mixed-bf16", "amp-fp16"]),
            "activation_checkpointing": rng.choice(["none", "full", "selective"]),
            "parallel": rng.choice(PARALLEL),
        }
        if rng.random() < 0.3:
            d["method"] = rng.choice(["lora", "qlora"])
            d["lora"] = {"targets": rng.choice([["all-linear"], ["q_proj", "v_proj"]])}
        for key, value in (
            ("framework", rng.choice(FRAMEWORKS)),
            ("allocator_conf", rng.choice(ALLOC_CONFS)),
        ):
            if value is not None:
                d[key] = value
        if rng.random() < 0.2:
            d["grad_accum_steps"] = rng.choice([2, 4, 5])
        if rng.random() < 0.2:
            d["gpu"] = rng.choice(["h100-80gb", "a100-40gb", "rtx-4090", "h200"])
        if rng.random() < 0.25:
            d["reserved_model"] = "fitted"
        yield d


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def child(count: int) -> dict[str, Any]:
    """One tree's digests: per scenario its estimate's (or its error's), per search its plan's columns."""
    import memsim_widget
    from memsim_widget.engine.core import estimate
    from memsim_widget.plan import plan
    from memsim_widget.scenario import Scenario

    out: dict[str, Any] = {"where": memsim_widget.__file__}
    for d in scenarios(count):
        try:
            text = repr(estimate(Scenario.from_dict(d)))
        except Exception as e:  # noqa: BLE001 (an invalid scenario: the same error in both trees)
            text = f"error {type(e).__name__}: {e}"
        out[json.dumps(d, sort_keys=True)] = digest(text)
    for args in PLANS:
        columns = plan(*args).columns
        out[f"plan{args}"] = digest(repr({k: v.tolist() for k, v in sorted(columns.items())}))
    return out


def run_tree(path: str, count: int) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": path}
    cmd = [sys.executable, __file__, "--child", "--count", str(count)]
    got = json.loads(subprocess.run(cmd, env=env, capture_output=True, check=True, text=True).stdout)
    if not got.pop("where").startswith(path):
        raise SystemExit(f"memsim_widget was not imported from {path}")
    return got


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--vs", metavar="REV", default="main", help="the git revision to compare with")
    ap.add_argument("--count", type=int, default=400, help="random scenarios")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.count)))
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        archive = subprocess.run(
            ["git", "archive", args.vs], cwd=ROOT, capture_output=True, check=True
        ).stdout
        subprocess.run(["tar", "-x", "-C", tmp], input=archive, check=True)
        old = run_tree(tmp, args.count)
    new = run_tree(str(ROOT), args.count)
    differ = [k for k in old if old[k] != new.get(k)]
    print(
        f"{len(old) - len(PLANS)} scenarios and {len(PLANS)} plans: {len(old) - len(differ)} identical to "
        f"{args.vs}'s, {len(differ)} differ"
    )
    for k in differ:
        print(f"  differs: {k}")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
