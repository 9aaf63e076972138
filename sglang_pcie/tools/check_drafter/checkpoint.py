"""Model folders, read without loading weights: config.json, safetensors headers, and the few tensors a check
asks for (the d2t / t2d maps, a sample of lm_head / embedding rows). A folder is a model folder or a Hugging Face cache entry (``models--org--name``,
or one of its ``snapshots/<hash>``); a sharded checkpoint is read through ``model.safetensors.index.json``, one
shard header per tensor looked up."""
from __future__ import annotations

import json
import struct
from pathlib import Path

from sglang_pcie.tools import safetensors_io
from sglang_pcie.tools.check_drafter.report import InputError

INTEGER_KEYS = ("hidden_size", "target_hidden_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "head_dim", "vocab_size", "draft_vocab_size", "num_aux_hidden_states")
# A mapping tensor is read whole; anything this large is not a vocabulary map.
MAX_MAP_ELEMENTS = 16 * 1024 * 1024


def resolve_model_dir(path: str) -> Path:
    """The folder holding config.json: ``path`` itself, or for a Hugging Face cache entry
    (``models--org--name``) the snapshot ``refs/main`` names (the only snapshot when there is no ref)."""
    folder = Path(path).expanduser()
    if folder.is_file():
        raise InputError(f"{path}: is a file, not a folder (give the model folder that holds config.json)")
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
        self.given = path  # as the user gave it
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
        self._data_starts: dict[Path, int] = {}

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

    def rows(self, name: str, rows: list[int], columns: list[int]) -> list[list[float]]:
        """Rows of a 2-D float tensor (BF16, F16, F32), each as the floats at ``columns`` (ascending): only the
        bytes from a row's start to its last column asked for are read, so a 1 TB checkpoint costs kilobytes."""
        file = self.tensors[name]
        entry = self._header(file)[name]
        dtype, (_, width) = entry["dtype"], entry["shape"]
        size, code = _ROW_CODES[dtype]
        span = (columns[-1] + 1) * size
        start = self._data_start(file) + entry["data_offsets"][0]
        found = []
        try:
            with open(file, "rb", buffering=0) as f:
                for row in rows:
                    f.seek(start + row * width * size)
                    values = _decode_row(dtype, code, f.read(span))
                    found.append([values[c] for c in columns])
        except (OSError, struct.error) as exc:
            raise InputError(f"{self.role} {file}: rows of {name!r} unreadable ({exc})") from None
        return found

    def _data_start(self, file: Path) -> int:
        """Where the tensor data of a safetensors file begins: after the 8-byte length and the header."""
        if file not in self._data_starts:
            with open(file, "rb") as f:
                self._data_starts[file] = 8 + struct.unpack("<Q", f.read(8))[0]
        return self._data_starts[file]


# The float types a row can be compared in: bytes per element, struct code (BF16: widened to F32).
_ROW_CODES = {"BF16": (2, "f"), "F16": (2, "e"), "F32": (4, "f")}


def _decode_row(dtype: str, code: str, data: bytes) -> tuple[float, ...]:
    if dtype == "BF16":  # a BF16 is the upper two bytes of an F32: put two zero bytes below each
        widened = bytearray(2 * len(data))
        widened[2::4], widened[3::4] = data[0::2], data[1::2]
        return struct.unpack(f"<{len(data) // 2}f", widened)
    return struct.unpack(f"<{len(data) // _ROW_CODES[dtype][0]}{code}", data)


# -- the drafter's config


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
