"""litgpt's own training step traced (memsim_widget/trace/litgpt.py): its GPT, LoRA layers and chunked loss on fake
tensors, and the engine's ``framework: "litgpt"`` rule held to it."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("litgpt")

from memsim_widget.errors import ScenarioError  # noqa: E402
from memsim_widget.trace.litgpt import litgpt_config_kwargs, lora_switches  # noqa: E402


def test_the_litgpt_config_takes_the_presets_dimensions() -> None:
    cfg = {"model_type": "llama", "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
           "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64, "vocab_size": 128256}  # fmt: skip
    kw = litgpt_config_kwargs(cfg, 512)
    assert (kw["n_embd"], kw["n_head"], kw["n_query_groups"], kw["head_size"]) == (2048, 32, 8, 64)
    assert kw["padded_vocab_size"] == 128256 and kw["mlp_class_name"] == "LLaMAMLP"
    with pytest.raises(ScenarioError) as err:
        litgpt_config_kwargs({**cfg, "model_type": "gpt2"}, 512)
    assert err.value.field == "framework"


def test_peft_target_names_map_to_litgpts_lora_switches() -> None:
    kw = lora_switches({"r": 16, "lora_alpha": 32, "target_modules": ["q_proj", "v_proj"]})
    assert kw == {"lora_r": 16, "lora_alpha": 32, "lora_dropout": 0.0, "lora_query": True, "lora_value": True}
    assert lora_switches({"target_modules": ["up_proj"]})["lora_mlp"]
    with pytest.raises(ScenarioError):
        lora_switches({"target_modules": ["c_attn"]})


def test_what_the_litgpt_tracer_cannot_run_is_refused_by_field() -> None:
    from memsim_widget.scenario import Scenario
    from memsim_widget.trace.traceable import check_traceable

    base = {"model": "llama-3.2-1b", "micro_batch_size": 1, "seq_len": 128, "framework": "litgpt"}
    with pytest.raises(ScenarioError) as err:
        check_traceable(Scenario.from_dict({**base, "parallel": {"dp": 2}}))
    assert err.value.field == "parallel"


def test_the_step_keeps_the_loops_logits_list_until_the_next_forward() -> None:
    """LitgptStep mirrors finetune/lora.py: the model returns 128-token lm_head chunks (the last one shifted by one
    token), and the list stays referenced after the loss, as the loop's ``logits`` binding, until the next forward."""
    import torch
    from litgpt.config import Config
    from litgpt.model import GPT

    from memsim_widget.trace.litgpt import LitgptStep

    cfg = {"model_type": "llama", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
           "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 50}  # fmt: skip
    step = LitgptStep(GPT(Config(**litgpt_config_kwargs(cfg, 300))))
    ids = torch.randint(0, 50, (2, 300))
    loss = step(ids, ids)
    assert loss.ndim == 0
    first = step.held
    assert [c.shape[1] for c in first] == [128, 128, 43]  # 300 tokens: two chunks and 44 less the shift
    step(ids, ids)
    assert step.held is not first


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "tolerance"),
    [
        ("litgpt llama bf16 b2 s512", 0.001),
        ("litgpt llama bf16 lora qv b2 s512", 0.02),  # HF's layer-backward transients kept: over, not under
        ("litgpt llama-3.2-1b dims L2 bf16 b2 s512", 0.001),
        ("litgpt llama-3.2-1b dims L2 bf16 lora qv b2 s1024", 0.01),
        ("litgpt llama amp-bf16 b2 s512", 0.005),  # each chunk's loss as CUDA's autocast runs it
        ("litgpt llama amp-bf16 lora qv b2 s512", 0.005),
        ("litgpt llama-3.2-1b dims L2 amp-bf16 lora qv b2 s1024 (frozen head recast per chunk)", 0.005),
    ],
)
def test_the_engine_holds_to_the_litgpt_trace(name: str, tolerance: float) -> None:
    from fidelity_cases import LITGPT_CASES, compare

    r = compare(name, dict(LITGPT_CASES)[name])
    assert -0.001 < r["error"] < tolerance, r
