"""drafter-delegation's payload on stand-in models: the rule it applies to the live target (an EAGLE run's target
model, exactly one EAGLE-3-capable language model that its forward runs whole), what the wrapper gains, where the
calls go and the one log line. The real SGLang 0.5.9 / 0.5.23 runs are in
tests/patches/drafter_delegation/test_drafter_delegation_check.py."""
from __future__ import annotations

import logging

import pytest

from sglang_pcie.patches.drafter_delegation import payload
from sglang_pcie.runtime.results import MARKER_ATTR

logger = logging.getLogger("stand-in model runner")  # the wrapped load_model's module's logger says what was added


class Algorithm:
    def __init__(self, eagle: bool):
        self.eagle = eagle

    def is_eagle(self):
        return self.eagle


class LanguageModel:
    """EAGLE-3-capable: records what it is asked."""

    def __init__(self):
        self.calls = []

    def set_eagle3_layers_to_capture(self, layer_ids=None):
        self.calls.append(("set_eagle3_layers_to_capture", layer_ids))

    def get_embed_and_head(self):
        self.calls.append(("get_embed_and_head",))
        return "embed", "head"

    def set_embed_and_head(self, embed, head):
        self.calls.append(("set_embed_and_head", embed, head))


class Backbone:
    def get_embed_and_head(self):  # half of what a capable model offers
        return "embed", "head"


class Module:
    def named_children(self):
        return [(name, child) for name, child in vars(self).items() if not name.startswith("_")]


def load(model, eagle=True, draft=False):
    def load_model(self):
        self.model = model
    load_model.__module__ = __name__
    runner = type("Runner", (), {"load_model": payload.wrap(load_model)})()
    runner.is_draft_worker, runner.spec_algorithm = draft, Algorithm(eagle)
    runner.load_model()
    return model


class OneModel(Module):
    def __init__(self):
        self.language_model, self.vision = LanguageModel(), object()

    def forward(self, ids):
        return self.language_model(ids)


class TwoModels(Module):
    def __init__(self):
        self.language_model, self.other_model = LanguageModel(), LanguageModel()

    def forward(self, ids):
        return self.language_model(ids) + self.other_model(ids)


class BackboneOnly(Module):
    def __init__(self):
        self.llm = LanguageModel()

    def forward(self, ids):
        return self.llm.model(ids)  # only its backbone: the captured states would not reach the logits


class WithBackbone(Module):
    def __init__(self):
        self.language_model, self.backbone = LanguageModel(), Backbone()

    def forward(self, ids):
        return self.language_model(self.backbone(ids))  # a backbone has no LM head: not a second language model


class HandedWhole(Module):
    def __init__(self):
        self.llm, self.head = LanguageModel(), Backbone()

    def forward(self, ids):
        return run(self.llm, ids)


def run(model, ids):
    return model


def added(cls):
    return {name: getattr(value, MARKER_ATTR, None) for name, value in vars(cls).items() if name in payload.METHODS}


@pytest.fixture
def said(caplog):
    caplog.set_level(logging.WARNING, logger=logger.name)
    return lambda: [r.getMessage() for r in caplog.records if r.name == logger.name]


def test_one_language_model_run_whole_gains_what_it_offers_forwarded_and_logged_once(said):
    class Wrapper(OneModel):
        pass
    model = load(Wrapper())
    trio = ("set_eagle3_layers_to_capture", "get_embed_and_head", "set_embed_and_head")
    assert added(Wrapper) == {m: payload.PATCH_ID for m in trio}  # not get_embed_and_head_for_draft: inner lacks it
    assert said() == []  # said at the first call, not at loading
    model.set_eagle3_layers_to_capture([2, 30])
    assert model.get_embed_and_head() == ("embed", "head")
    model.set_embed_and_head("e", head="h")
    model.set_eagle3_layers_to_capture(layer_ids=[5])
    assert model.language_model.calls == [("set_eagle3_layers_to_capture", [2, 30]), ("get_embed_and_head",),
                                          ("set_embed_and_head", "e", "h"), ("set_eagle3_layers_to_capture", [5])]
    assert said() == ["sglang-pcie drafter-delegation: Wrapper lacks set_eagle3_layers_to_capture, "
                      "get_embed_and_head, set_embed_and_head; forwarding to its language_model (LanguageModel)"]
    assert [vars(Wrapper)[m].__qualname__ for m in trio] == [f"{Wrapper.__qualname__}.{m}" for m in trio]


def test_a_wrapper_holding_two_language_models_gains_nothing(said):
    class Wrapper(TwoModels):
        pass
    load(Wrapper())
    assert added(Wrapper) == {} and said() == []


def test_a_language_model_only_whose_backbone_runs_gains_nothing_and_one_handed_on_whole_does():
    class Backboned(BackboneOnly):
        pass

    class Handed(HandedWhole):
        pass
    class Beside(WithBackbone):
        pass
    load(Backboned())
    load(Handed())
    load(Beside())
    assert set(added(Beside)) == {"set_eagle3_layers_to_capture", "get_embed_and_head", "set_embed_and_head"}
    assert added(Backboned) == {}
    assert set(added(Handed)) == {"set_eagle3_layers_to_capture", "get_embed_and_head", "set_embed_and_head"}


@pytest.mark.parametrize("eagle, draft", [(False, False), (True, True)])
def test_no_speculative_decoding_or_the_draft_model_gains_nothing(eagle, draft):
    class Wrapper(OneModel):
        pass
    load(Wrapper(), eagle=eagle, draft=draft)
    assert added(Wrapper) == {}


def test_a_capable_class_is_left_alone_and_a_method_it_has_is_never_replaced():
    class Capable(OneModel):
        def set_eagle3_layers_to_capture(self, layer_ids=None):
            return "own"

        def get_embed_and_head(self):
            return "own"

    class HalfCapable(OneModel):
        def set_eagle3_layers_to_capture(self, layer_ids=None):
            return "own"

    class Half(OneModel):
        def set_embed_and_head(self, embed, head):
            return "own"
    load(Capable())
    assert added(Capable) == {m: None for m in ("set_eagle3_layers_to_capture", "get_embed_and_head")}
    load(HalfCapable())  # lacks get_embed_and_head: not EAGLE-3-capable, so it gains the rest
    assert added(HalfCapable) == {"set_eagle3_layers_to_capture": None, "get_embed_and_head": payload.PATCH_ID,
                                  "set_embed_and_head": payload.PATCH_ID}
    model = load(Half())
    assert added(Half) == {"set_eagle3_layers_to_capture": payload.PATCH_ID, "get_embed_and_head": payload.PATCH_ID,
                           "set_embed_and_head": None}
    assert model.set_embed_and_head("e", "h") == "own"


def test_a_second_load_adds_nothing_and_the_wrapper_is_marked(said):
    class Wrapper(OneModel):
        pass
    load(Wrapper()).get_embed_and_head()
    first = dict(vars(Wrapper))
    load(Wrapper()).get_embed_and_head()
    assert all(vars(Wrapper)[m] is first[m] for m in added(Wrapper)) and len(said()) == 1
    assert getattr(payload.wrap(lambda self: None), MARKER_ATTR) == payload.PATCH_ID
