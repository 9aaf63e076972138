"""The models' shapes, presets and acceptance modes."""
from __future__ import annotations

from dataclasses import dataclass

# share of the draft vocabulary that the target's next-token map keeps (the rest is swapped in pairs); None: random
# weights, or the construction of tokenwise.py / interleaved.py
ACCEPTANCE = {"random": None, "mixed": 0.5, "full": 1.0, "tokenwise": None, "interleaved": None}
RMS_NORM_EPS = 1e-5


@dataclass(frozen=True)
class Shape:
    vocab: int = 32000
    hidden: int = 256
    layers: int = 4
    heads: int = 4
    kv_heads: int = 2
    intermediate: int = 1024
    draft_vocab: int = 8192
    max_positions: int = 4096

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def check(self) -> None:
        if self.hidden % self.heads:
            raise ValueError(f"--hidden {self.hidden} is not a multiple of --heads {self.heads}")
        if self.heads % self.kv_heads:
            raise ValueError(f"--heads {self.heads} is not a multiple of --kv-heads {self.kv_heads}")
        if self.layers < 4:
            raise ValueError(f"--layers {self.layers}: the drafter captures three distinct target layers (>= 4)")
        if not 0 < self.draft_vocab <= self.vocab:
            raise ValueError(f"--draft-vocab {self.draft_vocab}: must be in 1..{self.vocab} (the target's vocab)")

    def check_all_reduce(self, acceptance: str) -> None:
        """--all-reduce-check pairs heads, KV heads and MLP blocks (one per head) across shards, keeps one hidden
        coordinate per sublayer for its chain and one decoy token per draft token."""
        if ACCEPTANCE[acceptance] is None:  # random, tokenwise or interleaved
            raise ValueError(f"--all-reduce-check needs --acceptance mixed or full (got --acceptance {acceptance})")
        if self.heads % 2 or self.kv_heads % 2:
            raise ValueError(f"--all-reduce-check needs an even number of heads and KV heads, not --heads"
                             f" {self.heads} --kv-heads {self.kv_heads}")
        if self.intermediate % self.heads:
            raise ValueError(f"--all-reduce-check: --intermediate {self.intermediate} is not a multiple of --heads"
                             f" {self.heads} (one MLP block per head)")
        if 4 * self.layers > self.hidden:
            raise ValueError(f"--all-reduce-check: --hidden {self.hidden} is under 4 x --layers {self.layers} (the"
                             f" check chain takes 2 coordinates per layer, at most half the hidden size)")
        if 2 * self.draft_vocab > self.vocab:
            raise ValueError(f"--all-reduce-check: --draft-vocab {self.draft_vocab} is over half --vocab"
                             f" {self.vocab} (each draft token has a decoy outside the draft vocabulary)")


PRESETS = {
    "tiny": Shape(),
    # The shapes of the first real SGLang server on 2 x H200 (0.5.16): host-bound decode with CUDA graphs.
    "e2e": Shape(hidden=2048, layers=8, heads=16, kv_heads=8, intermediate=5632),
}


def aux_layer_ids(layers: int) -> list[int]:
    """Three distinct target layers for the drafter (0-based; SGLang captures the output of id + 1)."""
    return [0, layers // 2 - 1, layers - 2]
