"""Calibrated path survey (docs/fidelity.md): transformers causal LMs no family models, tiny configs, bf16 b2 s384,
the calibrated peak against a full fake-tensor trace of the whole model, and the exact parameter count.

Run: ``PYTHONPATH=. python benchmarks/calibrated_survey.py [model_type ...]`` (about 10-25 s per type).
"""

from __future__ import annotations

import sys
import time

from memsim_widget.engine.core import estimate
from memsim_widget.errors import ScenarioError
from memsim_widget.scenario import Scenario

CONFIGS = {
    "bloom": {"model_type": "bloom", "hidden_size": 128, "n_layer": 3, "n_head": 4, "vocab_size": 3000},
    "gpt_neo": {"model_type": "gpt_neo", "hidden_size": 128, "num_layers": 4, "num_heads": 4, "vocab_size": 3000,
                "attention_types": [[["global", "local"], 2]], "max_position_embeddings": 2048, "window_size": 64},
    "codegen": {"model_type": "codegen", "n_embd": 128, "n_layer": 3, "n_head": 4, "vocab_size": 3000,
                "rotary_dim": 16, "n_positions": 2048, "n_ctx": 2048},
    "biogpt": {"model_type": "biogpt", "hidden_size": 128, "num_hidden_layers": 3, "num_attention_heads": 4,
               "intermediate_size": 512, "vocab_size": 3000, "max_position_embeddings": 2048},
    "xglm": {"model_type": "xglm", "d_model": 128, "num_layers": 3, "attention_heads": 4, "ffn_dim": 512,
             "vocab_size": 3000, "max_position_embeddings": 2048},
    "persimmon": {"model_type": "persimmon", "hidden_size": 128, "num_hidden_layers": 3, "num_attention_heads": 4,
                  "intermediate_size": 512, "vocab_size": 3000},
    "mpt": {"model_type": "mpt", "d_model": 128, "n_layers": 3, "n_heads": 4, "vocab_size": 3000, "max_seq_len": 2048},
    "qwen2_moe": {"model_type": "qwen2_moe", "hidden_size": 128, "num_hidden_layers": 3, "num_attention_heads": 4,
                  "num_key_value_heads": 2, "intermediate_size": 256, "moe_intermediate_size": 64,
                  "shared_expert_intermediate_size": 128, "num_experts": 4, "num_experts_per_tok": 2,
                  "vocab_size": 3000},
    "granite": {"model_type": "granite", "hidden_size": 128, "num_hidden_layers": 3, "num_attention_heads": 4,
                "intermediate_size": 256, "vocab_size": 3000},
    "olmo": {"model_type": "olmo", "hidden_size": 128, "num_hidden_layers": 3, "num_attention_heads": 4,
             "intermediate_size": 256, "vocab_size": 3000},
}  # fmt: skip


def main(names: list[str]) -> None:
    from memsim_widget.trace.hf import trace_hf

    sc = {"micro_batch_size": 2, "seq_len": 384}
    for name, cfg in CONFIGS.items():
        if names and name not in names:
            continue
        t = time.perf_counter()
        try:
            est = estimate(Scenario.from_dict({"model": cfg, **sc}))
        except ScenarioError as exc:
            print(f"{name}: refused: {exc}"[:300])
            continue
        tr = trace_hf(cfg, progress=False, attention=est.arch.attention_kernel("sdpa"), **sc)
        err = (est.peak_tensor_bytes - tr.peak_bytes) / tr.peak_bytes
        print(
            f"{name}: peak {err:+.3%} vs full trace, fit residual {est.calibration['residual']:.3%}, "
            f"parameters {'exact' if est.parameters == tr.parameters else 'DIFFER'}, {time.perf_counter() - t:.1f} s"
        )


if __name__ == "__main__":
    main(sys.argv[1:])
