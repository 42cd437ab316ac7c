"""The planner's vector path under ``reserved_model: replay`` (``plan/vector._replayed_pools``): its one-GPU
candidates take their reserved bytes from the same cached replay as ``estimate`` (``alloc_stream.pool_replay``),
so every candidate, listed or not, equals ``estimate`` of that candidate byte for byte."""

from __future__ import annotations

import numpy as np
import pytest

from memsim_widget.plan import SearchSpace, plan


@pytest.mark.parametrize("conf", [None, "expandable_segments:True"])
def test_every_candidate_equals_estimate_with_the_replay(conf):
    base = {"model": "qwen2.5-0.5b", "seq_len": 512, "reserved_model": "replay", "allocator_conf": conf}
    p = plan(base=base, gpu="h100-sxm-80gb", gpus=(1, 2), space=SearchSpace(micro_batch=(1, 2)), top=10)
    assert p.mismatches(np.arange(p.evaluated)) == []
    replayed = [i for i in range(p.evaluated) if "replayed" in p.estimate(i).ranks[0].reserved.formula]
    assert replayed  # the one-GPU candidates without accumulation took the replay
