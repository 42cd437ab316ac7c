"""First-call and cached time of a model type calibrated from a trace (docs/fidelity.md, issue 12 item 3).

Run: ``PYTHONPATH=. python benchmarks/calibrated_speed.py``. Prints the first estimate of a GPT-J 6B-shaped config
(importing transformers, the meta-device build and the 11 traces of the fit), a second estimate with a new
(b, s) and the same recipe (no trace), and a preset's estimate for comparison.
"""

from __future__ import annotations

import time

from memsim_widget.engine.core import estimate
from memsim_widget.scenario import Scenario

GPTJ_6B = {"model_type": "gptj", "n_embd": 4096, "n_layer": 28, "n_head": 16, "rotary_dim": 64,
           "vocab_size": 50400, "n_positions": 2048}  # fmt: skip


def _ms(fn) -> float:  # noqa: ANN001
    t = time.perf_counter()
    fn()
    return (time.perf_counter() - t) * 1000


def main() -> None:
    first = _ms(lambda: estimate(Scenario.from_dict({"model": GPTJ_6B, "seq_len": 2048})))
    again = _ms(
        lambda: estimate(Scenario.from_dict({"model": GPTJ_6B, "seq_len": 1024, "micro_batch_size": 2}))
    )
    estimate(Scenario.from_dict({"model": "llama-3.1-8b", "seq_len": 1024}))
    preset = _ms(lambda: estimate(Scenario.from_dict({"model": "llama-3.1-8b", "seq_len": 4096})))
    est = estimate(Scenario.from_dict({"model": GPTJ_6B, "seq_len": 2048}))
    fit = est.calibration
    print(
        f"gptj 6B shape, first estimate: {first / 1000:.2f} s (fit {fit['seconds']} s, residual {fit['residual']:.3%})"
    )
    print(f"same recipe, new (b, s): {again:.2f} ms; preset (after its first call): {preset:.3f} ms")


if __name__ == "__main__":
    main()
