"""``sglang-pcie check-drafter``: catch a broken EAGLE-3 drafter before a long server start.

Reads only ``config.json``, safetensors headers and the two small mapping tensors (``d2t``, ``t2d``) of the
drafter (and of the target / a reference drafter when given): no GPU, no torch, no weight load.

The SGLang facts it relies on, read off the releases' sources (0.5.9, 0.5.16, 0.5.23):
- An EAGLE-3 drafter is loaded by a class listed in ``EntryClass`` of ``sglang/srt/models/*eagle3*.py``
  (0.5.9: ``LlamaForCausalLMEagle3``; 0.5.16 and 0.5.23 also ``Eagle3DeepseekV2ForCausalLM``).
- Its ``fc`` maps ``target_hidden_size`` (else ``hidden_size``) x N aux hidden states to ``hidden_size``.
  0.5.9 fixes N = 3; later releases read ``num_aux_hidden_states``, else the length of
  ``eagle_config.eagle_aux_hidden_state_layer_ids``, else 3. The architecture check reads which behaviour the
  SGLang in use has from its source.
- ``d2t[i]`` holds ``target_id - i`` for draft id ``i``; SGLang uses ``i + d2t[i]`` as the target id and ignores
  ``t2d`` (a bool mask over the target vocabulary, kept by training tools).
- Without ``draft_vocab_size`` (and untied embeddings) the drafter takes embeddings and lm_head from the target
  (``set_embed_and_head``); otherwise only the embeddings (``set_embed``), and not even those when
  ``target_hidden_size`` differs from ``hidden_size``.
- The target's ``set_eagle3_layers_to_capture(ids)`` fills ``layers_to_capture``: Llama-style models use
  ``id + 1``; ``DeepseekV2/V3ForCausalLM`` (Kimi-K2, K2.5's language model) in 0.5.16 and 0.5.23 use ``id + 1`` only
  when the first id is 1, else the ids unchanged; no ids gives ``[2, L // 2, L - 3]``. The layer loop captures
  index ``k`` before layer ``k`` runs, i.e. the output of layer ``k - 1``. This module runs the installed
  release's own ``set_eagle3_layers_to_capture`` on a stand-in object to learn the rule for the target class.
"""
from __future__ import annotations

import argparse
import ast
import builtins
import copy
import json
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

from sglang_pcie.patching import source as sglang_source_reader
from sglang_pcie.patching.source import SourceTree
from sglang_pcie.tools import safetensors_io
from sglang_pcie.tools.command import Command, UsageError

OK, WARN, FAIL, SKIP = "ok", "warn", "fail", "skip"
USAGE_ERROR = 2
SAMPLE_TEXT = Path(__file__).parent / "data" / "sample.txt"
# Coverage thresholds (share of the sample's target tokens inside the draft vocabulary); see docs/check-drafter.md.
COVERAGE_WARN = 0.80
COVERAGE_FAIL = 0.50
INTEGER_KEYS = ("hidden_size", "target_hidden_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "head_dim", "vocab_size", "draft_vocab_size", "num_aux_hidden_states")
# A mapping tensor is read whole; anything this large is not a vocabulary map.
MAX_MAP_ELEMENTS = 16 * 1024 * 1024


class InputError(Exception):
    """Unreadable input or bad usage: exit 2."""


@dataclass
class Check:
    name: str
    status: str
    reason: str
    data: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return {"check": self.name, "status": self.status, "reason": self.reason, **self.data}


def count(n: int) -> str:
    return f"{n:,}"


def plural(n: int, word: str) -> str:
    return f"{n:,} {word}{'' if n == 1 else 's'}"


# ---------------------------------------------------------------------------------------------------------------
# Model folders: a local folder or a Hugging Face cache entry; config and safetensors headers only.


def resolve_model_dir(path: str) -> Path:
    """The folder holding config.json: ``path`` itself, or for a Hugging Face cache entry
    (``models--org--name``) the snapshot ``refs/main`` names (the only snapshot when there is no ref)."""
    folder = Path(path).expanduser()
    if not folder.is_dir():
        raise InputError(f"{path}: no such folder")
    if (folder / "config.json").is_file():
        return folder
    if (folder / "snapshots").is_dir():
        ref = folder / "refs" / "main"
        if ref.is_file():
            snapshot = folder / "snapshots" / ref.read_text().strip()
            if (snapshot / "config.json").is_file():
                return snapshot
            raise InputError(f"{path}: refs/main names snapshot {snapshot.name!r}, which has no config.json")
        snapshots = [s for s in (folder / "snapshots").iterdir() if (s / "config.json").is_file()]
        if len(snapshots) == 1:
            return snapshots[0]
        raise InputError(f"{path}: no refs/main and {len(snapshots)} snapshots with a config.json; give one"
                         f" snapshots/<hash> folder")
    raise InputError(f"{path}: no config.json (not a model folder or a Hugging Face cache entry)")


class Checkpoint:
    """config.json plus the tensor directory of a model folder (headers only)."""

    def __init__(self, path: str, role: str):
        self.role = role
        self.dir = resolve_model_dir(path)
        try:
            self.config = json.loads((self.dir / "config.json").read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise InputError(f"{self.dir / 'config.json'}: unreadable ({exc})") from None
        if not isinstance(self.config, dict):
            raise InputError(f"{self.dir / 'config.json'}: not a JSON object")
        self._check_types()
        self._tensors: dict[str, Path] | None = None
        self._headers: dict[Path, dict] = {}

    def _check_types(self) -> None:
        """The numbers the checks use are integers (a quoted "7168" would otherwise multiply as a string)."""
        where = self.dir / "config.json"
        for scope in (self.config, self.text_config):
            for key in INTEGER_KEYS:
                value = scope.get(key)
                if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
                    raise InputError(f"{where}: {key} is {value!r}, not an integer")
        eagle = self.config.get("eagle_config")
        if eagle is not None and not isinstance(eagle, dict):
            raise InputError(f"{where}: eagle_config is {eagle!r}, not an object")
        ids = (eagle or {}).get("eagle_aux_hidden_state_layer_ids")
        if ids is not None and not (isinstance(ids, list)
                                    and all(isinstance(i, int) and not isinstance(i, bool) for i in ids)):
            raise InputError(f"{where}: eagle_aux_hidden_state_layer_ids is {ids!r}, not a list of integers")
        archs = self.config.get("architectures")
        if archs is not None and not (isinstance(archs, list) and all(isinstance(a, str) for a in archs)):
            raise InputError(f"{where}: architectures is {archs!r}, not a list of names")

    @property
    def text_config(self) -> dict:
        """The language model's settings: top level, or a wrapper's text_config (Kimi-K2.5, VLMs)."""
        for key in ("text_config", "language_config", "llm_config"):
            inner = self.config.get(key)
            if isinstance(inner, dict) and "hidden_size" in inner:
                return inner
        return self.config

    def get(self, key, default=None):
        value = self.config.get(key)
        return self.text_config.get(key, default) if value is None else value

    def _weight_map(self) -> dict[str, Path] | None:
        """name -> shard file from model.safetensors.index.json (None without an index); every shard must exist."""
        index = self.dir / "model.safetensors.index.json"
        if not index.is_file():
            return None
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
            shards = {file: self.dir / file for file in set(weight_map.values())}
            files = {name: shards[file] for name, file in weight_map.items()}
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise InputError(f"{index}: unreadable index ({exc})") from None
        missing = sorted(name for name, path in shards.items() if not path.is_file())
        if missing:
            raise InputError(f"{index}: names {len(missing)} missing shard(s), e.g. {missing[0]!r}")
        return files

    def _header(self, file: Path) -> dict:
        if file not in self._headers:
            try:
                self._headers[file] = safetensors_io.read_header(file)
            except (OSError, ValueError) as exc:
                raise InputError(f"{self.role} {file}: {exc}") from None
        return self._headers[file]

    @property
    def tensors(self) -> dict[str, Path]:
        """name -> file. From the index when there is one, so a sharded target costs one header per tensor
        looked up, not one per shard."""
        if self._tensors is None:
            weight_map = self._weight_map()
            if weight_map is None:
                weight_map = {name: file for file in sorted(self.dir.glob("*.safetensors"))
                              for name in self._header(file)}
            self._tensors = weight_map
        return self._tensors

    def find(self, *suffixes: str) -> tuple[str, dict] | None:
        """(name, header entry) of the first tensor named exactly, or ending in ``.<suffix>``, for the suffixes
        in order."""
        for suffix in suffixes:
            for name, file in self.tensors.items():
                if name == suffix or name.endswith("." + suffix):
                    entry = self._header(file).get(name)
                    if entry is None:
                        raise InputError(f"{self.role} {file}: the index places {name!r} here, its header lacks it")
                    return name, entry
        return None

    def read(self, name: str):
        file = self.tensors[name]
        entry = self._header(file)[name]
        if safetensors_io.numel(entry["shape"]) > MAX_MAP_ELEMENTS:
            raise InputError(f"{self.role} tensor {name!r} has shape {entry['shape']}: too large for a vocabulary map")
        try:
            return safetensors_io.read_tensor(file, name)[2]
        except (OSError, ValueError) as exc:
            raise InputError(f"{self.role} {file}: {exc}") from None


# ---------------------------------------------------------------------------------------------------------------
# What the SGLang in use says: EAGLE-3 draft classes, loader behaviour, the target's capture rule.


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
    path = facts.tree.path(module_name)
    # A wrapper (Kimi-K2.5) forwards to self.<attribute>.set_eagle3_layers_to_capture: follow that class. Where
    # the class cannot be named (``self.model = language_model_cls(...)``), an inner ``model`` is taken to keep
    # the indices it is given, as every such ``*Model`` method in 0.5.9-0.5.23 does.
    delegates, notes = {}, []
    for node in ast.walk(func):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "set_eagle3_layers_to_capture"
                and isinstance(node.func.value, ast.Attribute)
                and isinstance(node.func.value.value, ast.Name) and node.func.value.value.id == "self"):
            attribute = node.func.value.attr
            inner_class = facts.attribute_class((module_name, cls.name), attribute)
            inner = inner_class and _capture_rule(facts, inner_class, text_config, text_config, depth + 1)
            if inner is None and attribute == "model":
                inner = CaptureRule("", lambda ids: None if ids is None else list(ids))
                notes.append("self.model.set_eagle3_layers_to_capture assumed to keep the indices it is given")
            if inner is None:
                return None
            delegates[attribute] = inner
    # Names of the method's module (get_parallel(), logger) become stand-ins too.
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
    method = namespace[func.name]
    where = f"{cls.name}.set_eagle3_layers_to_capture ({path.name}, SGLang {facts.version})"
    where += "".join(f"; {note}" for note in notes)

    num_layers = text_config.get("num_hidden_layers")

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

    inner_text = next((inner.file_text for inner in delegates.values()), None)
    return CaptureRule(where, compute, inner_text if inner_text is not None else facts.tree.source(module_name))


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


# ---------------------------------------------------------------------------------------------------------------
# The checks.


def draft_layer_ids(draft: Checkpoint):
    eagle = draft.config.get("eagle_config") or {}
    ids = eagle.get("eagle_aux_hidden_state_layer_ids") if isinstance(eagle, dict) else None
    return list(ids) if isinstance(ids, (list, tuple)) else None


def aux_count(draft: Checkpoint, reads_num_aux: bool) -> tuple[int, str]:
    if not reads_num_aux:
        return 3, "fixed at 3 by this SGLang's loader"
    if draft.config.get("num_aux_hidden_states") is not None:
        return int(draft.config["num_aux_hidden_states"]), "num_aux_hidden_states"
    ids = draft_layer_ids(draft)
    if ids:
        return len(ids), "eagle_aux_hidden_state_layer_ids"
    return 3, "default 3"


@dataclass
class Context:
    draft: Checkpoint
    target: Checkpoint | None
    other: Checkpoint | None
    facts: SglangFacts | None
    text_path: Path
    loader_reads_num_aux: bool = True
    loader_single_layer: bool = False
    draft_ids: list | None = None  # target ids of the draft vocabulary (i + d2t[i]), once read


def check_architecture(ctx: Context) -> Check:
    archs = ctx.draft.config.get("architectures") or []
    arch = archs[0] if archs else None
    if ctx.facts is None:
        return Check("architecture", WARN, f"no SGLang installed: architecture not checked (draft says {arch!r};"
                     " use --sglang-source DIR or --sglang-version X)", {"architecture": arch})
    eagle3 = ctx.facts.entry_classes(eagle3_only=True)
    version = ctx.facts.version
    data = {"architecture": arch, "sglang_version": version, "eagle3_classes": sorted(eagle3)}
    if arch in eagle3:
        text = ctx.facts.loader_text(arch)
        ctx.loader_reads_num_aux = "num_aux_hidden_states" in text
        ctx.loader_single_layer = "only supports 1 layer" in text
        extra = []
        if not ctx.loader_reads_num_aux:
            extra.append("its fc takes 3 aux states whatever the config says")
        layers = ctx.draft.get("num_hidden_layers")
        if ctx.loader_single_layer and layers not in (None, 1):
            return Check("architecture", FAIL, f"{arch} of SGLang {version} ({ctx.facts.file_name(eagle3[arch])}) loads 1 decoder"
                         f" layer only; config.json has num_hidden_layers={layers}", data)
        return Check("architecture", OK, f"{arch} is an EAGLE-3 draft class of SGLang {version}"
                     f" ({ctx.facts.file_name(eagle3[arch])}){'; ' + '; '.join(extra) if extra else ''}", data)
    known = ", ".join(sorted(eagle3)) or "none"
    if arch in ctx.facts.entry_classes():
        return Check("architecture", FAIL, f"{arch!r} is a SGLang {version} model but not an EAGLE-3 draft class"
                     f" (those are: {known})", data)
    return Check("architecture", FAIL, f"{arch!r} is unknown to SGLang {version}'s EAGLE-3 loader"
                 f" (it knows: {known})", data)


def _shape(ckpt: Checkpoint, *names):
    hit = ckpt.find(*names)
    return (hit[0], hit[1]["shape"]) if hit else (None, None)


def check_shapes(ctx: Context) -> list[Check]:
    d, checks = ctx.draft, []
    hidden = d.get("hidden_size")
    target_hidden = d.config.get("target_hidden_size") or hidden
    n_aux, n_from = aux_count(d, ctx.loader_reads_num_aux)
    want_in = (target_hidden or 0) * n_aux
    fc_name, fc_shape = _shape(d, "fc.weight")
    data = {"hidden_size": hidden, "target_hidden_size": target_hidden, "num_aux_hidden_states": n_aux,
            "fc_weight": fc_shape}
    if fc_shape is None:
        checks.append(Check("input width", FAIL, "no fc.weight tensor in the drafter: not an EAGLE-3 checkpoint",
                            data))
    elif list(fc_shape) != [hidden, want_in]:
        checks.append(Check("input width", FAIL, f"{fc_name} is {fc_shape}, the loader builds"
                            f" [{hidden}, {want_in}] = hidden_size x (target_hidden_size {target_hidden} x"
                            f" {n_aux} aux states, {n_from})", data))
    else:
        checks.append(Check("input width", OK, f"{fc_name} {fc_shape} = target_hidden_size {target_hidden} x"
                            f" {n_aux} aux states ({n_from}) -> hidden_size {hidden}", data))

    # The draft's own attention: head dims from config against q/k projection shapes.
    heads, kv_heads = d.get("num_attention_heads"), d.get("num_key_value_heads") or d.get("num_attention_heads")
    head_dim = d.get("head_dim") or (hidden // heads if hidden and heads else None)
    q_name, q_shape = _shape(d, "self_attn.q_proj.weight")
    k_name, k_shape = _shape(d, "self_attn.k_proj.weight")
    data = {"head_dim": head_dim, "num_attention_heads": heads, "num_key_value_heads": kv_heads,
            "q_proj": q_shape, "k_proj": k_shape}
    problems = []
    if q_shape and heads and head_dim and list(q_shape) != [heads * head_dim, 2 * hidden]:
        problems.append(f"{q_name} is {q_shape}, config gives [{heads * head_dim}, {2 * hidden}]"
                        f" ({heads} heads x head_dim {head_dim}, input 2 x hidden_size)")
    if k_shape and kv_heads and head_dim and list(k_shape) != [kv_heads * head_dim, 2 * hidden]:
        problems.append(f"{k_name} is {k_shape}, config gives [{kv_heads * head_dim}, {2 * hidden}]")
    if problems:
        checks.append(Check("attention", FAIL, "; ".join(problems), data))
    elif q_shape is None:
        checks.append(Check("attention", SKIP, "no q_proj weight in the drafter (MLA or renamed layers):"
                            " head dims not checked", data))
    else:
        checks.append(Check("attention", OK, f"{heads} heads x head_dim {head_dim}, {kv_heads} KV heads match"
                            f" {q_name} {q_shape}", data))

    # Embeddings and lm_head: where SGLang takes them from.
    tied = bool(d.config.get("tie_word_embeddings"))
    draft_vocab = d.config.get("draft_vocab_size")
    vocab = d.get("vocab_size")
    lm_name, lm_shape = _shape(d, "lm_head.weight")
    emb_name, emb_shape = _shape(d, "embed_tokens.weight")
    data = {"tie_word_embeddings": tied, "draft_vocab_size": draft_vocab, "vocab_size": vocab,
            "lm_head": lm_shape, "embed_tokens": emb_shape}
    if tied:
        source = "lm_head is the embedding table (tie_word_embeddings)"
        head_from = "embeddings"
    elif draft_vocab is None:
        source = "embeddings and lm_head from the target (set_embed_and_head: no draft_vocab_size)"
        head_from = "target"
    else:
        head_from = "draft"
        source = "lm_head from the draft"
    embed_from = "target"
    if head_from != "target" and target_hidden != hidden:
        embed_from = "draft"
        source += f"; embeddings from the draft (target_hidden_size {target_hidden} != hidden_size {hidden})"
    elif head_from != "target":
        source += "; embeddings from the target (set_embed)"
    data.update(embed_from=embed_from, lm_head_from=head_from)
    problems = []
    if head_from == "draft":
        if lm_shape is None:
            problems.append(f"no lm_head.weight in the drafter, yet draft_vocab_size={draft_vocab} makes SGLang"
                            " use the draft's own")
        elif list(lm_shape) != [draft_vocab, hidden]:
            problems.append(f"{lm_name} is {lm_shape}, expected [draft_vocab_size {draft_vocab},"
                            f" hidden_size {hidden}]")
    if embed_from == "draft":
        if emb_shape is None:
            problems.append("no embed_tokens.weight in the drafter, yet it cannot share the target's")
        elif list(emb_shape) != [vocab, hidden]:
            problems.append(f"{emb_name} is {emb_shape}, expected [vocab_size {vocab}, hidden_size {hidden}]")
    checks.append(Check("embeddings", FAIL if problems else OK, "; ".join(problems) or source, data))

    if ctx.target is not None:
        t = ctx.target
        t_hidden, t_vocab, t_layers = t.get("hidden_size"), t.get("vocab_size"), t.get("num_hidden_layers")
        data = {"target_hidden_size_config": t_hidden, "target_vocab_size": t_vocab,
                "target_num_hidden_layers": t_layers}
        problems = []
        if target_hidden != t_hidden:
            problems.append(f"draft target_hidden_size {target_hidden} != target hidden_size {t_hidden}")
        if vocab != t_vocab:
            problems.append(f"draft vocab_size {vocab} != target vocab_size {t_vocab}")
        if head_from == "target" and hidden != t_hidden:
            problems.append(f"lm_head comes from the target (hidden {t_hidden}) but the draft's hidden_size is"
                            f" {hidden}")
        t_emb_name, t_emb = _shape(t, "embed_tokens.weight")
        if t_emb is not None and embed_from == "target" and t_hidden == target_hidden and t_emb[-1] != hidden:
            problems.append(f"target {t_emb_name} is {t_emb}: its width is not the draft's hidden_size {hidden}")
        checks.append(Check("target match", FAIL if problems else OK, "; ".join(problems) or
                            f"hidden {t_hidden} and vocab {t_vocab} agree with the target", data))
    return checks


def _is_ascending(ids) -> bool:
    return all(a < b for a, b in zip(ids, ids[1:]))


def check_layer_ids(ctx: Context) -> Check:
    ids = draft_layer_ids(ctx.draft)
    n_aux, _ = aux_count(ctx.draft, ctx.loader_reads_num_aux)
    data = {"layer_ids": ids, "num_aux_hidden_states": n_aux}
    if ctx.target is None:
        if ids and -1 in ids:
            return Check("layer ids", WARN, f"eagle_aux_hidden_state_layer_ids {ids} contain -1, which SGLang does"
                         " not read as 'the last layer'; give --target to see what is captured", data)
        said = ids if ids is not None else "absent (the target's default applies)"
        return Check("layer ids", SKIP, f"layer ids {said}; give --target to check them", data)
    t = ctx.target
    L = t.get("num_hidden_layers")
    archs = t.config.get("architectures") or [None]
    if not isinstance(L, int):
        return Check("layer ids", FAIL, f"target config has no num_hidden_layers ({L!r})", data)
    rule = None
    if ctx.facts is not None and archs[0]:
        try:
            rule = sglang_capture_rule(ctx.facts, archs[0], t.config, t.text_config)
        except (SyntaxError, ValueError, TypeError):
            rule = None
    if rule is None:
        rule = documented_capture_rule(L)
        if ctx.facts is not None:
            rule.source = (f"SGLang's Llama rule (id + 1), assumed: {archs[0]} has no set_eagle3_layers_to_capture"
                           f" that runs alone in SGLang {ctx.facts.version}")
    default_points = rule(None) or documented_capture_rule(L)(None)
    points = rule(ids) if ids is not None else default_points
    data.update(target_layers=L, rule=rule.source, capture_indices=points, default_indices=default_points)
    if points is None:
        return Check("layer ids", FAIL, f"{rule.source} rejects layer ids {ids}", data)
    words, unreached = describe_points(points, L)
    default_words, _ = describe_points(default_points, L)
    data["captured"] = words
    said = (f"layer ids {ids} -> " if ids is not None else "no layer ids in the draft config: the target default"
            f" [2, L//2, L-3] is in force -> ")
    same = ", as SGLang's default does" if ids is not None and points == default_points else ""
    summary = f"{said}captures {', '.join(words)} of {L}{same} (rule: {rule.source})"
    if unreached:
        return Check("layer ids", FAIL, f"{said}layer-loop indices {unreached} are never reached in 0..{L - 1}:"
                     f" only {len(points) - len(unreached)} of {n_aux} aux states get captured ({rule.source})",
                     data)
    if len(set(points)) != len(points):
        return Check("layer ids", FAIL, f"{said}indices {points} repeat: the loop captures each layer once, so"
                     f" {len(set(points))} states reach an fc built for {n_aux}", data)
    if len(points) != n_aux:
        return Check("layer ids", FAIL, f"{said}{len(points)} captures, but the drafter's fc takes {n_aux} aux"
                     " states", data)
    # Up to 0.5.9 the loop captures ``hidden_states + residual`` before each layer, and residual is still None
    # before layer 0: capturing index 0 raises at the first forward.
    if 0 in points and re.search(r"append\(\s*hidden_states \+ residual\s*\)", rule.file_text):
        return Check("layer ids", FAIL, f"{said}loop index 0 (the embeddings) is captured as hidden_states +"
                     f" residual while residual is still None: the first forward raises ({rule.source})", data)
    warnings = []
    if ids and -1 in ids:
        warnings.append("-1 is not 'the last layer': it becomes loop index 0, the embeddings")
    if ids and not _is_ascending(ids):
        warnings.append(f"ids {ids} are not ascending: SGLang concatenates the states in layer order")
    if ids and points != default_points:
        for shift in (1, -1):
            if [k + shift for k in default_points] == points:
                warnings.append(f"they are the default capture points shifted by {shift:+d} layer"
                                f" (default: {', '.join(default_words)}): right only if the drafter was trained"
                                " on exactly these")
        # [-1, 2, 30] against [2, 30, 58]: the default pattern (as indices or as ids) moved one slot along.
        for pattern in (default_points, [k - 1 for k in default_points]):
            if len(ids) > 1 and (ids[1:] == pattern[:-1] or ids[:-1] == pattern[1:]):
                warnings.append(f"they look like the default pattern {pattern} moved by one position")
                break
    if warnings:
        return Check("layer ids", WARN, f"{summary}; " + "; ".join(warnings), data)
    return Check("layer ids", OK, summary, data)


def _draft_target_ids(d2t) -> list[int]:
    return [i + int(v) for i, v in enumerate(d2t)]


def check_mapping(ctx: Context) -> Check:
    d = ctx.draft
    draft_vocab = d.config.get("draft_vocab_size")
    vocab = ctx.target.get("vocab_size") if ctx.target is not None else d.get("vocab_size")
    d2t_hit, t2d_hit = d.find("d2t"), d.find("t2d")
    data = {"draft_vocab_size": draft_vocab, "target_vocab_size": vocab,
            "d2t": d2t_hit[1]["shape"] if d2t_hit else None, "t2d": t2d_hit[1]["shape"] if t2d_hit else None}
    if d2t_hit is None:
        if draft_vocab is not None and vocab is not None and draft_vocab < vocab:
            return Check("mapping", FAIL, f"no d2t tensor but draft_vocab_size {draft_vocab} < vocab_size {vocab}:"
                         f" SGLang would take draft ids 0..{draft_vocab - 1} as target ids", data)
        return Check("mapping", OK, "no d2t: the drafter predicts over the full target vocabulary", data)
    name, entry = d2t_hit
    if len(entry["shape"]) != 1 or entry["dtype"] not in ("I64", "I32"):
        return Check("mapping", FAIL, f"{name} is {entry['dtype']} {entry['shape']}, expected I64"
                     f" [draft_vocab_size {draft_vocab}]", data)
    n = entry["shape"][0]
    problems = []
    if draft_vocab is not None and n != draft_vocab:
        problems.append(f"{name} has {count(n)} entries, draft_vocab_size is {count(draft_vocab)}")
    target_ids = _draft_target_ids(d.read(name))
    ctx.draft_ids = target_ids
    bad = [(i, t) for i, t in enumerate(target_ids) if t < 0 or (vocab is not None and t >= vocab)]
    if bad:
        i, t = bad[0]
        problems.append(f"{plural(len(bad), 'target id')} out of range 0..{count(vocab - 1) if vocab else '?'}"
                        f" (first: draft id {i} -> {t})")
    distinct = set(target_ids)
    if len(distinct) != len(target_ids):
        seen, first = set(), None
        for i, t in enumerate(target_ids):
            if t in seen:
                first = (i, t)
                break
            seen.add(t)
        problems.append(f"{plural(len(target_ids) - len(distinct), 'duplicate target id')} (first: draft id"
                        f" {first[0]} -> {first[1]}, already mapped)")
    t2d_note = "no t2d (SGLang does not read it)"
    if t2d_hit is not None:
        t_name, t_entry = t2d_hit
        if len(t_entry["shape"]) != 1 or (vocab is not None and t_entry["shape"][0] != vocab):
            problems.append(f"{t_name} has shape {t_entry['shape']}, expected [target vocab {vocab}]")
        else:
            mask = d.read(t_name)
            marked = {j for j, v in enumerate(mask) if v}
            if draft_vocab is not None and len(marked) != draft_vocab:
                problems.append(f"{t_name} marks {count(len(marked))} ids, draft_vocab_size is {count(draft_vocab)}")
            only_t2d, only_d2t = marked - distinct, distinct - marked
            if only_t2d or only_d2t:
                problems.append(f"d2t and t2d disagree: {count(len(only_d2t))} ids only in d2t,"
                                f" {count(len(only_t2d))} only in t2d")
            t2d_note = f"t2d marks the same {count(len(marked))} ids"
    if problems:
        return Check("mapping", FAIL, "; ".join(problems), data)
    return Check("mapping", OK, f"d2t maps {count(n)} draft ids to distinct target ids in"
                 f" 0..{count(max(target_ids)) if target_ids else 0}; {t2d_note}", data)


def load_tokenizer(target: Checkpoint):
    path = target.dir / "tokenizer.json"
    if not path.is_file():
        return None, f"no tokenizer.json in {target.dir.name}"
    try:
        from tokenizers import Tokenizer
    except ImportError:
        return None, "the tokenizers package is not installed (pip install tokenizers)"
    try:
        return Tokenizer.from_file(str(path)), None
    except Exception as exc:  # a tokenizer.json the library cannot read
        return None, f"{path.name}: {exc}"


def check_coverage(ctx: Context) -> Check:
    if ctx.target is None:
        return Check("coverage", SKIP, "give --target (with a tokenizer.json) to measure vocabulary coverage")
    if ctx.draft_ids is None:
        if ctx.draft.find("d2t") is None:
            return Check("coverage", OK, "no d2t: the draft vocabulary is the whole target vocabulary")
        return Check("coverage", SKIP, "the d2t map could not be read: coverage not measured")
    tokenizer, why = load_tokenizer(ctx.target)
    if tokenizer is None:
        return Check("coverage", WARN, f"{why}: coverage not measured")
    try:
        text = ctx.text_path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"--text {ctx.text_path}: {exc}") from None
    tokens = tokenizer.encode(text, add_special_tokens=False).ids
    if not tokens:
        return Check("coverage", SKIP, f"{ctx.text_path.name} gives no tokens")
    vocab = set(ctx.draft_ids)
    inside = sum(1 for t in tokens if t in vocab)
    share = inside / len(tokens)
    status = FAIL if share < COVERAGE_FAIL else WARN if share < COVERAGE_WARN else OK
    return Check("coverage", status, f"{share:.1%} of the {count(len(tokens))} target tokens of"
                 f" {ctx.text_path.name} are in the draft vocabulary ({count(len(vocab))} ids; healthy:"
                 f" >= {COVERAGE_WARN:.0%})", {"share": round(share, 4), "tokens": len(tokens),
                                                "text": str(ctx.text_path)})


def check_comparison(ctx: Context) -> Check | None:
    if ctx.other is None:
        return None
    o, d = ctx.other, ctx.draft
    mine, theirs = d.find("d2t"), o.find("d2t")
    if mine is None or theirs is None:
        which = "the drafter" if mine is None else "the --compare-d2t drafter"
        return Check("comparison", FAIL, f"{which} has no d2t tensor: nothing to compare")
    a, b = d.read(mine[0]), o.read(theirs[0])
    n = min(len(a), len(b))
    agree = sum(1 for i in range(n) if a[i] == b[i])
    shared = len(set(_draft_target_ids(a)) & set(_draft_target_ids(b)))
    data = {"agree": agree, "positions": max(len(a), len(b)), "shared_target_ids": shared,
            "other": str(o.dir)}
    notes = []
    if len(a) != len(b):
        notes.append(f"lengths differ: {count(len(a))} vs {count(len(b))}")
    mine_ids, their_ids = draft_layer_ids(d), draft_layer_ids(o)
    if mine_ids != their_ids:
        notes.append(f"layer ids differ: {mine_ids} here, {their_ids} there")
        data["other_layer_ids"] = their_ids
    if agree == len(a) == len(b):
        return Check("comparison", WARN if notes else OK, f"all {count(agree)} d2t positions agree"
                     + (f"; {'; '.join(notes)}" if notes else ""), data)
    reason = (f"{count(agree)} of {count(max(len(a), len(b)))} positions agree: the lm_head rows of one drafter"
              f" mean different tokens under the other's mapping ({count(shared)} target ids are in both"
              " vocabularies)")
    return Check("comparison", FAIL, reason + (f"; {'; '.join(notes)}" if notes else ""), data)


# ---------------------------------------------------------------------------------------------------------------
# Command.


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


def run_checks(draft: str, target: str | None = None, other: str | None = None, text: str | None = None,
               sglang_source: str | None = None, sglang_version: str | None = None) -> dict:
    started = time.perf_counter()
    ctx = Context(Checkpoint(draft, "draft"), Checkpoint(target, "target") if target else None,
                  Checkpoint(other, "compare-d2t") if other else None,
                  sglang_facts(sglang_source, sglang_version), Path(text) if text else SAMPLE_TEXT)
    if text and not ctx.text_path.is_file():
        raise InputError(f"--text {text}: no such file")
    checks = []
    for check in (check_architecture, check_shapes, check_layer_ids, check_mapping, check_coverage,
                  check_comparison):
        try:
            result = check(ctx)
        except (TypeError, ValueError, KeyError, AttributeError) as exc:  # e.g. "hidden_size": "7168"
            raise InputError(f"{check.__name__.replace('check_', '')}: a config value has the wrong type or form"
                             f" ({type(exc).__name__}: {exc})") from None
        checks.extend(result if isinstance(result, list) else [result] if result else [])
    return {"draft": str(ctx.draft.dir), "target": str(ctx.target.dir) if ctx.target else None,
            "sglang_version": ctx.facts.version if ctx.facts else None,
            "checks": [c.as_dict() for c in checks],
            "result": FAIL if any(c.status == FAIL for c in checks) else OK,
            "seconds": round(time.perf_counter() - started, 3)}


def format_table(report: dict) -> str:
    lines = [f"drafter {report['draft']}",
             f"target  {report['target'] or '(none: give --target DIR)'}",
             f"sglang  {report['sglang_version'] or '(not installed)'}"]
    width = max(len(c["check"]) for c in report["checks"])
    lines.append(f"{'CHECK':<{width}}  STATUS  REASON")
    for c in report["checks"]:
        lines.append(f"{c['check']:<{width}}  {c['status']:<6}  {c['reason']}")
    failed = sum(1 for c in report["checks"] if c["status"] == FAIL)
    warned = sum(1 for c in report["checks"] if c["status"] == WARN)
    lines.append(f"{failed} failed, {warned} warned, {len(report['checks'])} checks in {report['seconds']:.2f} s")
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--draft", required=True, metavar="DIR",
                        help="the EAGLE-3 drafter: a model folder or a Hugging Face cache entry")
    parser.add_argument("--target", metavar="DIR", help="the target model (config, headers and tokenizer)")
    parser.add_argument("--compare-d2t", metavar="OTHER_DRAFT_DIR", help="a reference drafter whose d2t should agree")
    parser.add_argument("--text", metavar="FILE", help="text for the coverage check (default: a bundled sample)")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--sglang-source", metavar="DIR", help="check against this SGLang tree, not the installed one")
    where.add_argument("--sglang-version", metavar="X", help="check against this release's wheel (fetched)")
    parser.add_argument("--json", action="store_true", help="print the report as one JSON object")


def run(args: argparse.Namespace) -> int:
    try:
        report = run_checks(args.draft, args.target, args.compare_d2t, args.text, args.sglang_source,
                            args.sglang_version)
    except InputError as exc:
        raise UsageError(str(exc)) from None
    print(json.dumps(report, indent=2) if args.json else format_table(report))
    return 1 if report["result"] == FAIL else 0


COMMAND = Command("check-drafter", "check an EAGLE-3 drafter against its target without loading weights",
                  add_arguments, run,
                  description="Check an EAGLE-3 drafter (and its fit to a target) from configs and safetensors"
                              " headers, before a long server start. Exit 0: nothing failed; 1: a check failed; 2:"
                              " bad usage or unreadable input.")
