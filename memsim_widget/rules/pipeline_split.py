"""How a pipeline splits the decoder layers over its stages: the one rule the engine, the planner, the rules
table and the pipeline trace read (``parallel.pp_split``, ``parallel.pp_layers``).

A pipeline of ``pp`` ranks with ``v`` virtual stages has ``n = pp * v`` model chunks; chunk ``s`` runs on rank
``s % pp`` (the looped placement of ``ScheduleInterleaved1F1B`` and Megatron's interleaved schedule: rank ``r``
holds chunks ``r, r + pp, ...``). The styles:

- ``even``: ``num_layers / n`` layers per chunk; refused where ``n`` does not divide the layers.
- ``torchtitan``: torchtitan's automatic split (``_generate_llm_fqn_per_model_part`` in
  ``torchtitan/distributed/pipeline_parallel.py``, pytorch/torchtitan commit b5bcd76c66d0): the embedding and
  the final norm + head each count as one layer (``pipeline_parallel_first/last_stage_less_layers`` = 1, its
  defaults), the ``num_layers + 2`` layer-equivalents are spread as evenly as they go (``(L + 2) // n`` per
  chunk, one more on the first ``(L + 2) % n`` chunks), and the first and last chunk then give up one layer
  for their embedding and head.
- ``megatron``: Megatron-Core with ``--account-for-embedding-in-pipeline-split`` and
  ``--account-for-loss-in-pipeline-split`` (``get_num_layers_to_build`` in
  ``megatron/core/transformer/transformer_block.py``, NVIDIA/Megatron-LM commit d98e8a64ddf3): ``(L + 2) / pp``
  layers per rank, ``/ v`` per chunk (both must divide, as Megatron asserts), one fewer on the first chunk of
  the first rank and on the last chunk of the last rank. Where Megatron accepts a layout the two styles give
  the same chunks; ``megatron`` refuses what Megatron refuses. Megatron's ``--decoder-first/last-pipeline-num-layers``
  are said with ``parallel.pp_layers`` (a list per rank).
- unset (None): ``even`` where ``n`` divides the layers, else ``torchtitan``, so the layouts the frameworks run
  are never refused for their layer count (Llama 3.1 405B's 126 layers on 16 x 4 chunks, DeepSeek-V3's 61 on
  16 stages).

``parallel.pp_layers`` (layers per rank) overrides the style; with virtual stages a rank's layers are spread
over its chunks as evenly as they go, the first chunks taking the remainder, except on the first rank, whose
first chunk also holds the embedding: there the last chunks take it (as both frameworks place a shortfall).
Without virtual stages the first rank may hold 0 layers (only the embedding) and the last rank 0 layers (only
the final norm + head + loss): torchtitan builds such stages from ``module_fqns_per_model_part`` (e.g.
``[["tok_embeddings"], ["layers.0", ...], ["norm", "output"]]``) and Megatron from layouts like
``"E|t*8|t*8|L"`` (``--pipeline-model-parallel-layout``, experimental); PyTorch's ``PipelineStage`` runs
them. A middle rank needs a layer (a stage of nothing), and so does every chunk under virtual stages (not
modelled).
"""

from __future__ import annotations

from collections.abc import Sequence

#: The values of ``parallel.pp_split``.
PP_SPLITS = ("even", "torchtitan", "megatron")
#: Layer-equivalents the embedding and the final norm + head count for (torchtitan's defaults; Megatron counts
#: each as one layer too).
EMBEDDING_WEIGHT = 1
HEAD_WEIGHT = 1


def split_style(pp_split: str | None, num_layers: int, chunks: int) -> str:
    """The style a scenario gets: ``pp_split``, or (unset) ``even`` where the chunks divide the layers, else
    ``torchtitan``."""
    if pp_split is not None:
        return pp_split
    return "even" if num_layers % chunks == 0 else "torchtitan"


def split_problem(num_layers: int, pp: int, v: int, style: str) -> str | None:
    """Why ``style`` cannot split ``num_layers`` over ``pp`` ranks x ``v`` chunks (None: it can). Every chunk
    keeps at least one layer (the styles never leave an end stage of only its embedding or head; a listed
    ``pp_layers`` may: ``layers_problem``)."""
    n = pp * v
    eff = num_layers + EMBEDDING_WEIGHT + HEAD_WEIGHT
    if style == "even" and num_layers % n:
        return f"{num_layers} layers are not divisible by pp*virtual_stages = {n}"
    if style == "torchtitan" and eff // n < 2:
        return (
            f"torchtitan's split of {num_layers} layers + embedding + head over {n} chunks leaves a chunk "
            "without a layer"
        )
    if style == "megatron" and (eff % pp or (eff // pp) % v or eff // n < 2):
        return (
            f"Megatron's split needs {num_layers} layers + embedding + loss = {eff} divisible by pp = {pp} and "
            f"then by virtual_stages = {v}, at least 2 per chunk"
        )
    return None


def layers_problem(num_layers: int, pp_layers: Sequence[int], v: int) -> str | None:
    """Why ``parallel.pp_layers`` cannot be the split (None: it can): the counts must add up to the layers;
    a middle stage needs a layer; with virtual stages every stage needs ``v`` (one per chunk), and without them
    the first and last stage may hold 0 (only the embedding, only the head and loss)."""
    got = list(pp_layers)
    if sum(got) != num_layers:
        return f"must add up to the model's {num_layers} layers, got {got} (sum {sum(got)})"
    if v > 1 and min(got) < v:
        return f"needs at least virtual_stages = {v} layers on every stage (one per chunk), got {got}"
    if min(got[1:-1], default=1) < 1:
        return (
            f"needs a layer on every middle stage (only the first and last may hold 0: the embedding alone, "
            f"the head and loss alone), got {got}"
        )
    return None


def chunk_layers(
    num_layers: int, pp: int, v: int, pp_split: str | None, pp_layers: Sequence[int] | None = None
) -> tuple[int, ...]:
    """The layers of each of the ``pp * v`` model chunks, in stage order (chunk ``s`` runs on rank ``s % pp``).
    Assumes the split is valid (``split_problem`` is None; ``pp_layers`` adds up)."""
    n = pp * v
    if pp_layers is not None:
        per_rank = [_spread(c, v)[:: -1 if r == 0 else 1] for r, c in enumerate(pp_layers)]
        return tuple(per_rank[s % pp][s // pp] for s in range(n))
    style = split_style(pp_split, num_layers, n)
    if style == "even":
        return (num_layers // n,) * n
    out = list(_spread(num_layers + EMBEDDING_WEIGHT + HEAD_WEIGHT, n))  # megatron: all equal where valid
    out[0] -= EMBEDDING_WEIGHT
    out[-1] -= HEAD_WEIGHT
    return tuple(out)


def rank_chunks(chunks: Sequence[int], pp: int, rank: int) -> tuple[int, ...]:
    """The layers of each chunk ``rank`` holds, in the order it runs them (its first chunk first)."""
    return tuple(chunks[rank::pp])


def rank_layers(chunks: Sequence[int], pp: int) -> tuple[int, ...]:
    """The layers each rank holds, first rank to last."""
    return tuple(sum(rank_chunks(chunks, pp, r)) for r in range(pp))


def _spread(total: int, parts: int) -> tuple[int, ...]:
    """``total`` over ``parts`` as evenly as it goes, the first ``total % parts`` taking one more."""
    base, extra = divmod(total, parts)
    return tuple(base + (i < extra) for i in range(parts))
