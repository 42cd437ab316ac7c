"""RoBERTa as ``RobertaForMaskedLM`` (transformers 5.24 ``models/roberta/modeling_roberta.py``).

BERT's post-norm encoder under other names: ``roberta.embeddings.*`` (word, position and token-type tables,
LayerNorm), ``roberta.encoder.layer.*`` exactly as BERT's layers, no pooler, and ``lm_head`` = ``dense`` +
``layer_norm`` + ``decoder`` whose weight is tied to the word embeddings and whose bias is ``lm_head.bias``
(one [V] tensor). The published checkpoints use ``type_vocab_size`` 1 and ``max_position_embeddings`` 514:
positions are numbered from ``pad_token_id + 1`` (fairseq's ``make_positions``), so the first
``pad_token_id + 1`` rows are never indexed and the longest sequence is 514 - 2 = 512. Activations are
BERT's: the same modules save the same tensors. XLM-RoBERTa (``xlm-roberta``) and CamemBERT (``camembert``)
are this model under their own class names (checked tensor for tensor against transformers' meta build).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from memsim_widget.architecture.config_keys import read_int
from memsim_widget.architecture.encoder import MaskedLMNames, bert_encoder
from memsim_widget.architecture.types import Architecture, register_family
from memsim_widget.families.bert import BERT_DEFAULTS

#: transformers 5.24 ``RobertaConfig`` defaults that differ from BERT's (pad_token_id 1 sets the offset).
ROBERTA_DEFAULTS: dict[str, Any] = {**BERT_DEFAULTS, "pad_token_id": 1}

ROBERTA_NAMES = MaskedLMNames(
    encoder="roberta.",
    head_dense="lm_head.dense",
    head_norm="lm_head.layer_norm",
    decoder="lm_head.decoder",
    head_bias="lm_head.bias",
)


#: Model types that are RoBERTa tensor for tensor (same ``roberta.`` / ``lm_head`` names, same config defaults),
#: with their masked-LM class.
HF_CLASSES: dict[str, str] = {
    "roberta": "RobertaForMaskedLM",
    "xlm-roberta": "XLMRobertaForMaskedLM",
    "camembert": "CamembertForMaskedLM",
}


@register_family(
    "roberta", "xlm-roberta", "camembert"
)  # the keys of HF_CLASSES, written out: read unimported
def build_roberta(cfg: Mapping[str, Any]) -> Architecture:
    """RoBERTa as ``RobertaForMaskedLM`` (XLM-R, CamemBERT: the same model under their own class): BERT's
    encoder, ``lm_head`` tied, positions offset by pad + 1."""
    pad = read_int(cfg, "pad_token_id", ROBERTA_DEFAULTS["pad_token_id"], minimum=0)
    return bert_encoder(
        cfg,
        family="roberta",
        hf_class=HF_CLASSES.get(str(cfg.get("model_type")), "RobertaForMaskedLM"),
        names=ROBERTA_NAMES,
        defaults=ROBERTA_DEFAULTS,
        position_offset=pad + 1,
        extra={"pad_token_id": pad},
    )
