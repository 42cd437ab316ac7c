"""What Inductor's min-cut partitioner saves for backward in a compiled step, per family: the forward graph's extra
outputs (the saved tensors), grouped by the module that produced them, with shape, dtype and bytes.

Run: python benchmarks/compiled_saved.py "qwen3 bf16 sdpa b2 s512 compiled" [--budget 1.0]
(a case name from fidelity_cases.COMPILED_CASES (tests/data) or CASES, or a scenario as JSON, traced compiled; about a minute a case on one
core). Prints the compiled trace's peak, the engine's, and the saved tensors of every forward graph.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
from pathlib import Path
from typing import Any

import torch
import torch.fx

from memsim_widget.engine.core import estimate
from memsim_widget.scenario import Scenario
from memsim_widget.trace import compiled

# the engine-vs-trace case matrices are test data (tests/data), not in the wheel
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "data"))
from fidelity_cases import CASES, COMPILED_CASES  # noqa: E402

_GRAPHS: list[torch.fx.GraphModule] = []


def _recording_runner(gm: torch.fx.GraphModule, example_inputs: list[torch.Tensor], **kw: Any) -> Any:
    _GRAPHS.append(gm)
    return _ORIGINAL(gm, example_inputs, **kw)


_ORIGINAL = compiled._boxed_runner


def _where(node: torch.fx.Node) -> str:
    stack = node.meta.get("nn_module_stack") or {}
    path = list(stack.values())[-1][0] if stack else "(top)"
    for i in range(100):  # layer index -> N
        path = path.replace(f".{i}.", ".N.").replace(f"[{i}]", "[N]").replace(f"_{i}_", "_N_")
    return f"{path}:{compiled._op_name(node)}"


def saved(
    gm: torch.fx.GraphModule, bw_inputs: int | None = None
) -> list[tuple[str, tuple[int, ...], str, int]]:
    """(where, shape, dtype, bytes) of each tensor output of a forward graph."""
    out_node = next(iter(gm.graph.find_nodes(op="output")))
    rows = []
    for n in out_node.args[0]:
        if not isinstance(n, torch.fx.Node):
            continue
        v = n.meta.get("val")
        if not isinstance(v, torch.Tensor):
            continue
        rows.append(
            (_where(n), tuple(v.shape), str(v.dtype).replace("torch.", ""), v.numel() * v.element_size())
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    from memsim_widget.trace.api import trace_config

    ap = argparse.ArgumentParser()
    ap.add_argument("case")
    ap.add_argument("--budget", type=float, default=1.0)
    args = ap.parse_args(argv)
    data = (
        json.loads(args.case)
        if args.case.startswith("{")
        else {**dict(CASES), **dict(COMPILED_CASES)}[args.case]
    )
    sc = Scenario.from_dict({**data, "compile": True})
    compiled._boxed_runner = _recording_runner
    tr = trace_config(sc, compile_budget=args.budget, progress=False)
    est = estimate(sc)
    print(f"trace {tr.peak_bytes:,} ({tr.peak_phase}, {tr.peak_op}); engine {est.peak_tensor_bytes:,} "
          f"({est.peak_tensor_bytes / tr.peak_bytes - 1:+.2%})")  # fmt: skip
    fw = [
        g
        for g in _GRAPHS
        if not any(p.name.startswith("tangents") for p in g.graph.find_nodes(op="placeholder"))
    ]
    seen: set[int] = set()
    for gm in fw:
        if id(gm) in seen:
            continue
        seen.add(id(gm))
        agg: dict[tuple[str, tuple[int, ...], str], list[int]] = collections.defaultdict(lambda: [0, 0])
        for where, shape, dtype, nbytes in saved(gm):
            agg[(where, shape, dtype)][0] += 1
            agg[(where, shape, dtype)][1] += nbytes
        print(f"--- forward graph: {sum(v[1] for v in agg.values()):,} B in its outputs")
        for (where, shape, dtype), (count, nbytes) in agg.items():
            print(f"{count:3d} x {where:<70} {shape!s:<22} {dtype:<9} {nbytes:>14,}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
