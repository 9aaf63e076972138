"""The drafter's own shapes against its config and SGLang's loader: architecture, input width, attention,
where the embeddings and lm_head come from, and the fit to the target's sizes."""
from __future__ import annotations

from sglang_pcie.tools.check_drafter.checkpoint import Checkpoint, aux_count
from sglang_pcie.tools.check_drafter.context import Context
from sglang_pcie.tools.check_drafter.report import FAIL, OK, SKIP, WARN, Check


def shape(ckpt: Checkpoint, *names):
    hit = ckpt.find(*names)
    return (hit[0], hit[1]["shape"]) if hit else (None, None)


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
        text, loader = ctx.facts.loader_text(arch), ctx.facts.file_name(eagle3[arch])
        ctx.loader_reads_num_aux = "num_aux_hidden_states" in text
        ctx.loader_single_layer = "only supports 1 layer" in text
        extra = "" if ctx.loader_reads_num_aux else "; its fc takes 3 aux states whatever the config says"
        layers = ctx.draft.get("num_hidden_layers")
        if ctx.loader_single_layer and layers not in (None, 1):
            return Check("architecture", FAIL, f"{arch} of SGLang {version} ({loader}) loads 1 decoder layer only;"
                         f" config.json has num_hidden_layers={layers}", data)
        return Check("architecture", OK, f"{arch} is an EAGLE-3 draft class of SGLang {version} ({loader}){extra}",
                     data)
    known = ", ".join(sorted(eagle3)) or "none"
    if arch in ctx.facts.entry_classes():
        return Check("architecture", FAIL, f"{arch!r} is a SGLang {version} model but not an EAGLE-3 draft class"
                     f" (those are: {known})", data)
    return Check("architecture", FAIL, f"{arch!r} is unknown to SGLang {version}'s EAGLE-3 loader"
                 f" (it knows: {known})", data)


def check_input_width(ctx: Context) -> Check:
    d = ctx.draft
    hidden = d.get("hidden_size")
    target_hidden = d.config.get("target_hidden_size") or hidden
    n_aux, n_from = aux_count(d, ctx.loader_reads_num_aux)
    want_in = (target_hidden or 0) * n_aux
    fc_name, fc_shape = shape(d, "fc.weight")
    data = {"hidden_size": hidden, "target_hidden_size": target_hidden, "num_aux_hidden_states": n_aux,
            "fc_weight": fc_shape}
    if fc_shape is None:
        return Check("input width", FAIL, "no fc.weight tensor in the drafter: not an EAGLE-3 checkpoint", data)
    if list(fc_shape) != [hidden, want_in]:
        return Check("input width", FAIL, f"{fc_name} is {fc_shape}, the loader builds [{hidden}, {want_in}] ="
                     f" hidden_size x (target_hidden_size {target_hidden} x {n_aux} aux states, {n_from})", data)
    return Check("input width", OK, f"{fc_name} {fc_shape} = target_hidden_size {target_hidden} x {n_aux} aux states"
                 f" ({n_from}) -> hidden_size {hidden}", data)


def check_attention(ctx: Context) -> Check:
    """The draft's own attention: head dims from the config against the q/k projection shapes."""
    d = ctx.draft
    hidden = d.get("hidden_size")
    heads, kv_heads = d.get("num_attention_heads"), d.get("num_key_value_heads") or d.get("num_attention_heads")
    head_dim = d.get("head_dim") or (hidden // heads if hidden and heads else None)
    q_name, q_shape = shape(d, "self_attn.q_proj.weight")
    k_name, k_shape = shape(d, "self_attn.k_proj.weight")
    data = {"head_dim": head_dim, "num_attention_heads": heads, "num_key_value_heads": kv_heads,
            "q_proj": q_shape, "k_proj": k_shape}
    problems = []
    if q_shape and heads and head_dim and list(q_shape) != [heads * head_dim, 2 * hidden]:
        problems.append(f"{q_name} is {q_shape}, config gives [{heads * head_dim}, {2 * hidden}]"
                        f" ({heads} heads x head_dim {head_dim}, input 2 x hidden_size)")
    if k_shape and kv_heads and head_dim and list(k_shape) != [kv_heads * head_dim, 2 * hidden]:
        problems.append(f"{k_name} is {k_shape}, config gives [{kv_heads * head_dim}, {2 * hidden}]")
    if problems:
        return Check("attention", FAIL, "; ".join(problems), data)
    if q_shape is None:
        return Check("attention", SKIP, "no q_proj weight in the drafter (MLA or renamed layers): head dims not"
                     " checked", data)
    return Check("attention", OK, f"{heads} heads x head_dim {head_dim}, {kv_heads} KV heads match {q_name}"
                 f" {q_shape}", data)


def head_and_embeddings(d: Checkpoint) -> tuple[str, str, str]:
    """(where lm_head comes from, where the embeddings come from, in words): "target", "draft" or "embeddings"
    (tied), as SGLang's EAGLE worker decides (set_embed_and_head / set_embed)."""
    hidden, target_hidden = d.get("hidden_size"), d.config.get("target_hidden_size") or d.get("hidden_size")
    if d.config.get("tie_word_embeddings"):
        head_from, words = "embeddings", "lm_head is the embedding table (tie_word_embeddings)"
    elif d.config.get("draft_vocab_size") is None:
        head_from, words = "target", "embeddings and lm_head from the target (set_embed_and_head: no draft_vocab_size)"
    else:
        head_from, words = "draft", "lm_head from the draft"
    if head_from != "target" and target_hidden != hidden:
        return head_from, "draft", words + (f"; embeddings from the draft (target_hidden_size {target_hidden} !="
                                            f" hidden_size {hidden})")
    return head_from, "target", words + ("" if head_from == "target" else "; embeddings from the target (set_embed)")


def check_embeddings(ctx: Context) -> Check:
    d = ctx.draft
    hidden, draft_vocab, vocab = d.get("hidden_size"), d.config.get("draft_vocab_size"), d.get("vocab_size")
    lm_name, lm_shape = shape(d, "lm_head.weight")
    emb_name, emb_shape = shape(d, "embed_tokens.weight")
    head_from, embed_from, words = head_and_embeddings(d)
    data = {"tie_word_embeddings": bool(d.config.get("tie_word_embeddings")), "draft_vocab_size": draft_vocab,
            "vocab_size": vocab, "lm_head": lm_shape, "embed_tokens": emb_shape, "embed_from": embed_from,
            "lm_head_from": head_from}
    problems = head_problems(d, head_from, lm_name, lm_shape)
    if embed_from == "draft":
        if emb_shape is None:
            problems.append("no embed_tokens.weight in the drafter, yet it cannot share the target's")
        elif list(emb_shape) != [vocab, hidden]:
            problems.append(f"{emb_name} is {emb_shape}, expected [vocab_size {vocab}, hidden_size {hidden}]")
    if problems:
        return Check("embeddings", FAIL, "; ".join(problems), data)
    if head_from == "target" and lm_shape is not None:
        return Check("embeddings", WARN, f"{words}; the drafter's own {lm_name} {lm_shape} is loaded, then replaced"
                     " by the target's: a head trained with the drafter goes unused (give draft_vocab_size to keep"
                     " it)", data)
    return Check("embeddings", OK, words, data)


def head_problems(d: Checkpoint, head_from: str, lm_name, lm_shape) -> list[str]:
    """What is wrong with the lm_head SGLang builds for the drafter (see head_and_embeddings)."""
    hidden, draft_vocab, vocab = d.get("hidden_size"), d.config.get("draft_vocab_size"), d.get("vocab_size")
    if head_from == "embeddings" and draft_vocab is not None and vocab is not None and draft_vocab < vocab:
        return [f"tie_word_embeddings with draft_vocab_size {draft_vocab:,} < vocab_size {vocab:,}: SGLang's loader"
                f" makes lm_head the embedding table ({vocab:,} rows, the target's once shared) and keeps the logits"
                f" of its first {draft_vocab:,} rows, so draft id i is scored with target token i's row and served"
                " as target id i + d2t[i]"]
    if head_from != "draft":
        return []
    if lm_shape is None:
        return [f"no lm_head.weight in the drafter, yet draft_vocab_size={draft_vocab} makes SGLang build the"
                " draft's own lm_head, which nothing then loads: it keeps its random initialisation and no draft"
                " is accepted (sglang #27908)"]
    if list(lm_shape) != [draft_vocab, hidden]:
        return [f"{lm_name} is {lm_shape}, expected [draft_vocab_size {draft_vocab}, hidden_size {hidden}]"]
    return []


def check_target_match(ctx: Context) -> Check | None:
    if ctx.target is None:
        return None
    d, t = ctx.draft, ctx.target
    hidden, vocab = d.get("hidden_size"), d.get("vocab_size")
    target_hidden = d.config.get("target_hidden_size") or hidden
    head_from, embed_from, _ = head_and_embeddings(d)
    t_hidden, t_vocab, t_layers = t.get("hidden_size"), t.get("vocab_size"), t.get("num_hidden_layers")
    data = {"target_hidden_size_config": t_hidden, "target_vocab_size": t_vocab,
            "target_num_hidden_layers": t_layers}
    problems = []
    if target_hidden != t_hidden:
        problems.append(f"draft target_hidden_size {target_hidden} != target hidden_size {t_hidden}")
    if vocab != t_vocab:
        problems.append(f"draft vocab_size {vocab} != target vocab_size {t_vocab}")
    if head_from == "target" and hidden != t_hidden:
        problems.append(f"lm_head comes from the target (hidden {t_hidden}) but the draft's hidden_size is {hidden}")
    t_emb_name, t_emb = shape(t, "embed_tokens.weight")
    if t_emb is not None and embed_from == "target" and t_hidden == target_hidden and t_emb[-1] != hidden:
        problems.append(f"target {t_emb_name} is {t_emb}: its width is not the draft's hidden_size {hidden}")
    return Check("target match", FAIL if problems else OK, "; ".join(problems) or
                 f"hidden {t_hidden} and vocab {t_vocab} agree with the target", data)
