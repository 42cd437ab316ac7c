"""Model architecture: the shapes and parameter counts of a model, per module kind, from an HF config.

The engine reads only the ``Architecture`` object; it never looks at raw HF config keys. Each model family is
one module in ``memsim_widget/families/`` whose builder (HF config mapping -> Architecture) registers its
``model_type`` values in ``FAMILIES`` with ``register_family`` (the module is imported on first use); it lists
every parameter tensor of the transformers class used for training (named in its docstring), as transformers 5.x
builds it. This package holds
what the families share:

- ``types``: ``Architecture``, ``ParamGroup``, ``PARAM_KINDS``, the registry (``FAMILIES``, ``register_family``);
- ``config_keys``: readers of HF config keys that validate and name the key in their error (``read_int``, ...);
- ``layers``: the parameter groups of a Linear, norms, an embedding, an LM head; the MLP activation labels;
- ``decoder``: ``build_decoder``, the RMSNorm + RoPE decoder-only builder most families start from;
- ``encoder``: ``bert_encoder``, the post-norm BERT-shaped encoder with its masked-LM head;
- ``moe``: routed experts, router and dense MLPs of the mixture-of-experts families;
- ``vision``: the vision towers multimodal families embed (CLIP's, SigLIP's) and their sub-config helpers;
- ``dispatch``: ``build_architecture`` (dispatch on ``model_type``) and the unknown-type error;
- ``registry``: ``LazyRegistry``, the mapping behind ``FAMILIES`` that imports a family's module on first use.
"""

from __future__ import annotations

from memsim_widget.architecture.dispatch import build_architecture, unknown_model_type
from memsim_widget.architecture.types import (
    FAMILIES,
    PARAM_KINDS,
    Architecture,
    FamilyBuilder,
    ParamGroup,
    register_family,
)

__all__ = [
    "FAMILIES",
    "PARAM_KINDS",
    "Architecture",
    "FamilyBuilder",
    "ParamGroup",
    "build_architecture",
    "register_family",
    "unknown_model_type",
]

# The family modules (memsim_widget/families/) register themselves when imported: the registry imports one the
# first time one of its model types is asked for.
from memsim_widget import families as _families  # noqa: E402

FAMILIES.expect(_families.module_of_type())
