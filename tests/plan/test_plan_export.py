"""``plan(...).for_export(F)``: the memory/throughput frontier of the candidates F can express.

A candidate F cannot express never hides one it can (the README's 8B QLoRA on one RTX 4090: selective-op
checkpointing and the chunked loss beat every candidate the Trainer can run, which were dropped before): every
fitting candidate F expresses is listed or beaten on both memory and throughput by a listed one of its layout,
and what F left out of the plain list is counted by the field its writer names.
"""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memsim_widget.export import FORMATS
from memsim_widget.plan import plan

MODELS = ("qwen2.5-0.5b", "llama-3.2-1b", "llama-3.1-8b")


def test_readme_8b_qlora_on_a_4090_exports_to_the_trainer():
    p = plan("llama-3.1-8b", "rtx-4090", 1, method="qlora", seq_len=2048)
    refused = [i for i in p.ranking.tolist() if p.export_refusal(i, "hf") is not None]
    assert refused, (
        "some candidates of the plain list need a key the Trainer lacks (chunked loss, per-op ckpt)"
    )
    hf = p.for_export("hf")
    assert hf.listed > 0
    for i in hf.ranking.tolist():
        assert p.export_refusal(i, "hf") is None and bool(p.columns["fits"][i])
    assert sum(v["count"] for v in hf.left_out.values()) == len(refused)


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    model=st.sampled_from(MODELS),
    gpu=st.sampled_from(["rtx-4090", "a100-40gb"]),
    method=st.sampled_from(["full", "lora", "qlora"]),
    gpus=st.sampled_from([1, 2, 4]),
    fmt=st.sampled_from(sorted(FORMATS)),
)
def test_for_export_is_the_frontier_of_what_the_format_expresses(model, gpu, method, gpus, fmt):
    p = plan(model, gpu, gpus, method=method, seq_len=2048, top=None)
    ranked = p.for_export(fmt)
    c = p.columns
    ok = {i: p.export_refusal(i, fmt) is None for i in np.nonzero(c["fits"])[0].tolist()}
    assert ranked.ranking.tolist() == p._frontier_of(lambda i: ok[i]).tolist()
    listed = set(ranked.ranking.tolist())
    group = ("num_gpus", "dp", "tp", "pp", "cp", "ep", "optimizer", "method")
    for i, expressible in ok.items():
        if not expressible or i in listed:
            continue
        assert any(  # a listed candidate of its layout is at least as fast with no more memory
            all(c[k][j] == c[k][i] for k in group)
            and c["tokens_per_gpu_s"][j] >= c["tokens_per_gpu_s"][i]
            and c["device_total_bytes"][j] <= c["device_total_bytes"][i]
            for j in listed
        )
    counts: dict[str, int] = {}
    for i in p.frontier.tolist():
        if (err := p.export_refusal(i, fmt)) is not None:
            counts[err.field] = counts.get(err.field, 0) + 1
    assert {k: v["count"] for k, v in ranked.left_out.items()} == counts
