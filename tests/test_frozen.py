"""Frozen model configs (``memsim_widget/frozen``) and the architecture resolved once per config object.

A scenario's inline config is immutable, so ``architecture_for`` remembers its Architecture on the object: the
scenarios made from it by ``replace`` (the scaling stops, the objective's training scenario) hold the same object
and never resolve it again, while any other config object (one key different) resolves its own.
"""

from __future__ import annotations

import pickle
from typing import Any

import pytest

from memsim_widget.architecture import build_architecture
from memsim_widget.catalog import models
from memsim_widget.catalog.models import PRESETS, architecture_for
from memsim_widget.frozen import FrozenDict, freeze, thaw
from memsim_widget.scenario import Scenario

INLINE = dict(PRESETS["llama-3.2-1b"])


@pytest.fixture
def resolutions(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The model inputs ``architecture_for`` resolves (by content, not from a config object's memo)."""
    seen: list[Any] = []
    real = models.resolve_architecture

    def counting(model: Any) -> Any:
        seen.append(model)
        return real(model)

    monkeypatch.setattr(models, "resolve_architecture", counting)
    return seen


def test_replace_keeps_the_model_object_and_its_resolution(resolutions: list[Any]) -> None:
    sc = Scenario(model=INLINE, seq_len=256)
    stops = [sc.replace(micro_batch_size=b) for b in (1, 2, 4)] + [sc.replace(seq_len=s) for s in (128, 512)]
    assert all(stop.model is sc.model for stop in stops)
    archs = {id(architecture_for(s.model)) for s in [sc, *stops]}
    assert len(archs) == 1
    assert resolutions == [sc.model]


def test_one_key_different_is_another_architecture_through_a_warm_memo() -> None:
    """Two configs differing only in one key resolve to their own architectures, each equal to a cold build."""
    for key, value in (("num_hidden_layers", 3), ("hidden_size", 1024), ("vocab_size", 1000)):
        warm = Scenario(model=INLINE)
        architecture_for(warm.model)
        other = warm.replace(model={**INLINE, key: value})
        got = architecture_for(other.model)
        assert got == build_architecture({**INLINE, key: value})
        assert got != architecture_for(warm.model)
        assert architecture_for(warm.model) == build_architecture(INLINE)


def test_a_plain_dict_is_resolved_on_every_call(resolutions: list[Any]) -> None:
    """A mutable dict may change between calls: it is never memoised by identity."""
    config = dict(INLINE)
    first = architecture_for(config)
    config["num_hidden_layers"] = 3
    second = architecture_for(config)
    assert (first.num_layers, second.num_layers) == (INLINE["num_hidden_layers"], 3)
    assert len(resolutions) == 2


def test_freeze_trusts_only_what_it_built() -> None:
    """A FrozenDict made by ``freeze`` is kept as it is; one built directly (a list inside) is frozen again."""
    built = freeze({"model_type": "llama", "layers": [1, 2]})
    assert freeze(built) is built
    direct = FrozenDict({"model_type": "llama", "layers": [1, 2]})
    again = freeze(direct)
    assert again is not direct and again["layers"] == (1, 2)
    assert thaw(again) == {"model_type": "llama", "layers": [1, 2]}


def test_pickle_and_copy_keep_the_content_not_the_memo() -> None:
    sc = Scenario(model=INLINE)
    arch = architecture_for(sc.model)
    back = pickle.loads(pickle.dumps(sc))
    assert back == sc and back.model is not sc.model
    assert architecture_for(back.model) == arch


def test_the_hash_is_the_contents_and_computed_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Equal configs hash equal (the engine's caches find one by the other); each object hashes its JSON once."""
    from memsim_widget import frozen

    computed: list[Any] = []
    real = frozen._content_hash
    monkeypatch.setattr(frozen, "_content_hash", lambda d: computed.append(d) or real(d))
    a, b = freeze(INLINE), freeze(dict(INLINE))
    assert a is not b and a == b
    assert {hash(a) for _ in range(3)} == {hash(b)}
    assert computed == [a, b]
    assert {Scenario(model=a): 1}[Scenario(model=b)] == 1
