"""The compiled ViT step traced on fake CUDA tensors (benchmarks/compiled_fake_cuda.py, issue 26): what CUDA runs
differently from the CPU trace, and the engine's math-SDPA rule held to it (engine/activations/compiled_layernorm.py,
``CUDA_MATH_SDPA``)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LAYERS, BATCH, S, HEADS = 2, 8, 197, 12

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("g++") is None, reason="the fake CUDA library is built with g++"),
]


def _trace(*flags: str) -> dict:
    """The script's JSON result for a 2-layer ViT-B (real widths) at batch 8 on cuda fakes."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, str(ROOT / "benchmarks" / "compiled_fake_cuda.py"), "--json",
           "--layers", str(LAYERS), "--batch", str(BATCH), *flags]  # fmt: skip
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, check=True).stdout
    return json.loads(next(line for line in out.splitlines() if line.startswith("RESULT "))[7:])


def _fp32_scores(r: dict) -> list[dict]:
    """Saved fp32 tensors of b x heads x s x s elements (the math composite's scores or probabilities)."""
    n = BATCH * HEADS * S * S
    return [t for t in r["saved"] if t["dtype"] == "float32" and t["bytes"] == 4 * n]


def test_transformers_517s_compile_mask_sends_cuda_sdpa_to_the_math_kernel_and_saves_fp32_scores() -> None:
    """With transformers 5.17's mask under compile (an expand of a (1, 1, s, 1) column: last-dim stride 0, which
    CUDA's fused kernels refuse, torch 2.13 ``sdp_utils_cpp.h``), SDPA's CUDA composite runs the math path: the
    partitioner saves one fp32 b x heads x s x s tensor per layer and no kernel logsumexp; the engine's per-layer
    math-SDPA term is exactly that tensor."""
    from memsim_widget.engine.activations import activations
    from memsim_widget.engine.activations.compiled import _layer_weight_numel
    from memsim_widget.engine.activations.compiled_layernorm import CUDA_MATH_SDPA, layernorm_activations
    from memsim_widget.engine.context import Context
    from memsim_widget.scenario import Scenario

    r = _trace("--mask-517")
    assert r["masks"] and all(m[1][-1] == 0 for m in r["masks"]), r["masks"]
    scores = _fp32_scores(r)
    assert len(scores) == LAYERS, scores
    assert not any(t["shape"] == [BATCH, HEADS, S] for t in r["saved"])  # no fused kernel's logsumexp
    model = {"model_type": "vit", "hidden_size": 768, "num_hidden_layers": LAYERS, "num_attention_heads": HEADS,
             "intermediate_size": 3072, "image_size": 224, "patch_size": 16, "num_labels": 1000}  # fmt: skip
    sc = Scenario.from_dict({"model": model, "micro_batch_size": BATCH, "seq_len": S, "precision": "amp-bf16",
                             "compile": True})  # fmt: skip
    ctx = Context(sc)
    assert ("vit", sc.precision) in CUDA_MATH_SDPA
    act = activations(ctx)
    layernorm_activations(ctx, act, _layer_weight_numel(ctx), math_sdpa=True)
    term = next(t for t in act.per_layer if t.name.startswith("compiled CUDA math SDPA"))
    assert term.bytes == scores[0]["bytes"]


def test_without_the_mask_the_fake_cuda_step_saves_what_the_cpu_trace_saves() -> None:
    """transformers 5.24 skips the mask under compile: no mask reaches SDPA, nothing s x s is saved, and with the
    kernel CUDA picks (cuDNN on an H200) the saved bytes are the CPU trace's but for the logsumexp's layout (the
    same bytes) and cuDNN's two int64 RNG scalars per layer."""
    cuda = _trace("--sdpa", "cudnn")
    cpu = _trace("--device", "cpu")
    assert not cuda["masks"] and not _fp32_scores(cuda)
    total = sum(t["bytes"] for t in cuda["saved"]) - sum(t["bytes"] for t in cpu["saved"])
    assert total == LAYERS * 2 * 8
