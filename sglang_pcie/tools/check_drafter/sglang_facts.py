"""What the SGLang in use says, read from its source through SourceTree without importing it: which architectures
its registry lists (``EntryClass``) and which of them are EAGLE-3 drafters, what their loaders do, and how a target
class turns ``eagle_aux_hidden_state_layer_ids`` into the layers it captures.

The facts, read off the releases' sources (0.5.9, 0.5.16, 0.5.23):
- An EAGLE-3 drafter is loaded by a class listed in ``EntryClass`` of ``sglang/srt/models/*eagle3*.py``
  (0.5.9: ``LlamaForCausalLMEagle3``; 0.5.16 and 0.5.23 also ``Eagle3DeepseekV2ForCausalLM``).
- Its ``fc`` maps ``target_hidden_size`` (else ``hidden_size``) x N aux hidden states to ``hidden_size``.
  0.5.9 fixes N = 3; later releases read ``num_aux_hidden_states``, else the length of
  ``eagle_config.eagle_aux_hidden_state_layer_ids``, else 3. The architecture check reads which behaviour the
  SGLang in use has from its loader's source.
- The target's ``set_eagle3_layers_to_capture(ids)`` fills ``layers_to_capture``: Llama-style models use
  ``id + 1``; ``DeepseekV2/V3ForCausalLM`` (Kimi-K2, K2.5's language model) in 0.5.16 and 0.5.23 use ``id + 1`` only
  when the first id is 1, else the ids unchanged; no ids gives ``[2, L // 2, L - 3]``. The layer loop captures
  index ``k`` before layer ``k`` runs, i.e. the output of layer ``k - 1``. Rather than a table of these rules, the
  release's own ``set_eagle3_layers_to_capture`` of the target class runs on a stand-in object.
"""
from __future__ import annotations

import ast
import builtins
import copy
from dataclasses import dataclass, field
from pathlib import Path

from sglang_pcie.patching import source as sglang_source_reader
from sglang_pcie.patching.source import SourceTree
from sglang_pcie.tools.check_drafter.report import InputError

MODELS = "sglang.srt.models"

class SglangFacts:
    """What check-drafter needs of one SGLang tree, read through SourceTree without importing it: the
    architectures its registry lists (``EntryClass``), their classes and methods, names resolved as Python would."""

    def __init__(self, tree: SourceTree):
        self.tree = tree
        self.version = tree.version
        self._entries: dict[bool, dict[str, str]] = {}

    def entry_classes(self, eagle3_only: bool = False) -> dict[str, str]:
        """Architecture name -> the module whose ``EntryClass`` lists it (SGLang's model registry); with
        ``eagle3_only`` the modules named ``*eagle3*`` only."""
        if eagle3_only not in self._entries:
            found = self._entries[eagle3_only] = {}
            for module in self.tree.modules(MODELS):
                if eagle3_only and "eagle3" not in module.rpartition(".")[2] or "EntryClass" not in (
                        self.tree.source(module) or ""):
                    continue
                for value in self.tree.assignments(module, "EntryClass"):
                    for node in ast.walk(value):
                        name = node.id if isinstance(node, ast.Name) else getattr(node, "attr", None)
                        if name:
                            found.setdefault(name, module)
        return self._entries[eagle3_only]

    def file_name(self, module: str) -> str:
        return self.tree.path(module).name

    def loader_text(self, architecture: str) -> str:
        module = self.entry_classes(eagle3_only=True).get(architecture)
        return self.tree.source(module) or "" if module else ""

    def architecture_class(self, architecture: str) -> tuple[str, str] | None:
        """(module, class) that SGLang's registry serves ``architecture`` with: the name its EntryClass lists,
        resolved in that module."""
        module = self.entry_classes().get(architecture)
        return self.tree.class_at(module, architecture) if module else None

    def method(self, key: tuple[str, str] | None, name: str):
        """(module, ClassDef, FunctionDef) of method ``name`` of the class ``key`` = (module, class), own or
        inherited, or None."""
        for owner in self.tree.lineage(*key) if key else ():
            node = self.tree.class_node(*owner)
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == name:
                    return owner[0], node, item
        return None

    def attribute_class(self, key: tuple[str, str], attribute: str) -> tuple[str, str] | None:
        """The class assigned to ``self.<attribute> = Class(...)`` in the class's (or its bases') __init__."""
        hit = self.method(key, "__init__")
        for node in ast.walk(hit[2]) if hit else ():
            if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)
                    and isinstance(node.value.func, ast.Name)
                    and any(isinstance(t, ast.Attribute) and t.attr == attribute for t in node.targets)):
                name = node.value.func.id
                # An import inside __init__ binds the name there (mllama4's Llama4ForCausalLM).
                local = next(((self.tree.absolute(hit[0], i), a.name) for i in ast.walk(hit[2])
                              if isinstance(i, ast.ImportFrom) for a in i.names if (a.asname or a.name) == name), None)
                return self.tree.class_at(*local) if local else self.tree.class_at(hit[0], name)
        return None


def sglang_facts(source: str | None, version: str | None) -> SglangFacts | None:
    """The SGLang tree to check against: a release's wheel, a folder, or the installed one (None: none)."""
    try:
        if version:
            from sglang_pcie.patching.releases import fetch_source

            root = fetch_source(version)
        elif source:
            root = Path(source)
        else:
            root = sglang_source_reader.installed_sglang_root()  # looked up here: tests replace it
            if root is None:
                return None
        return SglangFacts(SourceTree(root))
    except (ValueError, RuntimeError, OSError) as exc:
        raise InputError(str(exc)) from None


# -- the target's capture rule, run on a stand-in


class _StandIn:
    """Stands for ``self`` (and what hangs off it) while a target's set_eagle3_layers_to_capture runs alone:
    any attribute exists, and every assignment to ``layers_to_capture`` is recorded."""

    def __init__(self, record: list, attrs: dict | None = None):
        object.__setattr__(self, "_record", record)
        object.__setattr__(self, "_attrs", dict(attrs or {}))

    def __getattr__(self, name):
        attrs = object.__getattribute__(self, "_attrs")
        if name not in attrs:
            attrs[name] = _StandIn(object.__getattribute__(self, "_record"))
        return attrs[name]

    def __setattr__(self, name, value):
        if name == "layers_to_capture":
            object.__getattribute__(self, "_record").append(list(value))
        object.__getattribute__(self, "_attrs")[name] = value

    def __getitem__(self, key):  # self.model.layers[i]: another stand-in
        return _StandIn(object.__getattribute__(self, "_record"))

    def __call__(self, *args, **kwargs):  # get_parallel(): another stand-in
        return _StandIn(object.__getattribute__(self, "_record"))


_SAFE_BUILTINS = {name: getattr(builtins, name)
                  for name in ("len", "max", "min", "list", "tuple", "set", "sorted", "range", "int", "any", "all",
                               "enumerate", "isinstance", "hasattr", "getattr", "setattr", "ValueError",
                               "AttributeError",
                               "NotImplementedError", "RuntimeError")}


@dataclass
class CaptureRule:
    """layers_to_capture (layer-loop indices) for given ids, as the target class of one SGLang computes it."""

    source: str  # where the rule comes from, for the report
    compute: object  # callable: ids or None -> list[int] | None
    file_text: str = field(default="", repr=False)  # the model file holding the layer loop

    def __call__(self, ids):
        return self.compute(ids)


def _config_stand_in(record: list, config: dict) -> _StandIn:
    return _StandIn(record, {key: _config_stand_in(record, value) if isinstance(value, dict) else value
                             for key, value in config.items()})


def sglang_capture_rule(facts: SglangFacts, architecture: str, config: dict,
                        text_config: dict) -> CaptureRule | None:
    """The release's own set_eagle3_layers_to_capture of the class serving ``architecture``, run on a stand-in."""
    return _capture_rule(facts, facts.architecture_class(architecture), config, text_config)


def _capture_rule(facts: SglangFacts, key, config: dict, text_config: dict, depth: int = 0) -> CaptureRule | None:
    hit = facts.method(key, "set_eagle3_layers_to_capture")
    if hit is None or depth > 3:
        return None
    module_name, cls, func = hit
    found = _delegates(facts, (module_name, cls.name), func, text_config, depth)
    method = _method_alone(func, facts.tree.path(module_name))
    if found is None or method is None:
        return None
    delegates, notes = found
    where = f"{cls.name}.set_eagle3_layers_to_capture ({facts.file_name(module_name)}, SGLang {facts.version})"
    inner_text = next((inner.file_text for inner in delegates.values()), None)
    return CaptureRule(where + "".join(f"; {note}" for note in notes),
                       _on_stand_in(method, delegates, config, text_config.get("num_hidden_layers")),
                       inner_text if inner_text is not None else facts.tree.source(module_name))


def _delegates(facts: SglangFacts, key, func, text_config: dict, depth: int):
    """({attribute: the inner model's rule}, notes) for a wrapper (Kimi-K2.5) that forwards to
    ``self.<attribute>.set_eagle3_layers_to_capture``; None when an inner rule cannot be had. Where the inner class
    cannot be named (``self.model = language_model_cls(...)``), an inner ``model`` is taken to keep the indices it
    is given, as every such ``*Model`` method in 0.5.9-0.5.23 does."""
    delegates, notes = {}, []
    for node in ast.walk(func):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "set_eagle3_layers_to_capture"
                and isinstance(node.func.value, ast.Attribute)
                and isinstance(node.func.value.value, ast.Name) and node.func.value.value.id == "self"):
            attribute = node.func.value.attr
            inner_class = facts.attribute_class(key, attribute)
            inner = inner_class and _capture_rule(facts, inner_class, text_config, text_config, depth + 1)
            if inner is None and attribute == "model":
                inner = CaptureRule("", lambda ids: None if ids is None else list(ids))
                notes.append("self.model.set_eagle3_layers_to_capture assumed to keep the indices it is given")
            if inner is None:
                return None
            delegates[attribute] = inner
    return delegates, notes


def _method_alone(func: ast.FunctionDef, path: Path):
    """The method compiled alone, with only basic builtins; the names of its module it uses (get_parallel(),
    logger) are stand-ins. None when it cannot run alone (``*args``, a default naming something of SGLang's)."""
    local_names = {a.arg for a in func.args.posonlyargs + func.args.args + func.args.kwonlyargs}
    local_names |= {n.id for n in ast.walk(func) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    free_names = {n.id for n in ast.walk(func) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    free_names -= local_names | set(_SAFE_BUILTINS) | {"True", "False", "None"}
    func = copy.deepcopy(func)
    func.decorator_list, func.returns = [], None
    for arg in func.args.posonlyargs + func.args.args + func.args.kwonlyargs:
        arg.annotation = None
    if func.args.vararg or func.args.kwarg:
        return None
    module = ast.fix_missing_locations(ast.Module(body=[func], type_ignores=[]))
    namespace = {"__builtins__": _SAFE_BUILTINS}
    namespace.update({name: _StandIn([]) for name in free_names})
    try:
        exec(compile(module, str(path), "exec"), namespace)  # defines this one method; imports nothing
    except Exception:  # a default value naming something of SGLang's: the rule cannot run alone
        return None
    return namespace[func.name]


def _on_stand_in(method, delegates: dict, config: dict, num_layers):
    """ids -> the layer-loop indices ``method`` records on a stand-in for the target (None when it fails)."""
    def compute(ids):
        record: list = []
        # config.json as attributes (nested objects too); inner models with as many layers as the config says.
        attrs = {"config": _config_stand_in(record, {"num_hidden_layers": num_layers, **config})}
        layers = [_StandIn(record) for _ in range(num_layers if isinstance(num_layers, int) else 0)]
        for attribute in ("model", "language_model"):
            attrs[attribute] = _StandIn(record, {"layers": layers})
        for attribute, inner in delegates.items():
            def forward(layer_ids, inner=inner):
                record.append(inner(layer_ids))
            attrs[attribute] = _StandIn(record, {"layers": layers, "set_eagle3_layers_to_capture": forward})
        try:
            method(_StandIn(record, attrs), None if ids is None else list(ids))
        except Exception:
            return None
        return record[-1] if record and record[-1] is not None else None

    return compute


def documented_capture_rule(num_layers: int) -> CaptureRule:
    """SGLang's Llama-style rule, used when no SGLang tree is at hand."""
    return CaptureRule("SGLang's Llama rule (id + 1; no ids: [2, L//2, L-3]), assumed: no SGLang installed",
                       lambda ids: [2, num_layers // 2, num_layers - 3] if ids is None else [i + 1 for i in ids])


def describe_points(points: list[int], num_layers: int) -> tuple[list[str], list[int]]:
    """(words for each layer-loop index, the indices the loop 0..L-1 never reaches)."""
    words, unreached = [], []
    for k in points:
        if k == 0:
            words.append("the embeddings (input of layer 0)")
        elif 0 < k < num_layers:
            words.append(f"output of layer {k - 1}")
        elif k == num_layers:
            words.append(f"output of layer {k - 1}, after the loop (only where the model captures there)")
        else:
            words.append(f"index {k}, never reached")
            unreached.append(k)
    return words, unreached
