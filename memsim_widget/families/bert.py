"""BERT as ``BertForMaskedLM`` (transformers 5.24 ``models/bert/modeling_bert.py``): the shared masked-LM encoder
(``architecture/encoder.py``) under BERT's tensor names."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from memsim_widget.architecture.encoder import MaskedLMNames, bert_encoder
from memsim_widget.architecture.types import Architecture, register_family

#: transformers 5.24 ``BertConfig`` defaults (RoBERTa starts from these).
BERT_DEFAULTS: dict[str, Any] = {
    "hidden_act": "gelu",
    "hidden_dropout_prob": 0.1,
    "attention_probs_dropout_prob": 0.1,
    "max_position_embeddings": 512,
    "type_vocab_size": 2,
    "layer_norm_eps": 1e-12,
    "tie_word_embeddings": True,
    "is_decoder": False,
    "add_cross_attention": False,
}


BERT_NAMES = MaskedLMNames(
    encoder="bert.",
    head_dense="cls.predictions.transform.dense",
    head_norm="cls.predictions.transform.LayerNorm",
    decoder="cls.predictions.decoder",
    head_bias="cls.predictions.bias",
)


@register_family("bert")
def build_bert(cfg: Mapping[str, Any]) -> Architecture:
    """BERT as ``BertForMaskedLM`` (no pooler): MLM head = dense + LayerNorm + vocab bias.

    The MLM decoder weight is tied to the word embeddings and counted once (as the embedding); its
    [vocab] bias is counted as head. With ``tie_word_embeddings: false`` the decoder's own weight and
    bias are added (transformers 5 then leaves ``cls.predictions.bias`` a separate, unused tensor).
    """
    return bert_encoder(
        cfg, family="bert", hf_class="BertForMaskedLM", names=BERT_NAMES, defaults=BERT_DEFAULTS
    )
