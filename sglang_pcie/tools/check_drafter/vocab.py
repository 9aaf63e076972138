"""The vocabulary: the d2t / t2d maps, coverage of a text by the draft vocabulary, agreement with a reference
drafter's map. ``d2t[i]`` holds ``target_id - i`` for draft id ``i``; SGLang serves ``i + d2t[i]`` (its
``hot_token_id``) and ignores ``t2d``, which training tools keep as a boolean mask over the target vocabulary."""
from __future__ import annotations

from sglang_pcie.tools.check_drafter.checkpoint import Checkpoint, draft_layer_ids
from sglang_pcie.tools.check_drafter.context import Context
from sglang_pcie.tools.check_drafter.report import FAIL, OK, SKIP, WARN, Check, InputError, count, plural

# Coverage thresholds (share of the sample's target tokens inside the draft vocabulary); see docs/check-drafter.md.
COVERAGE_WARN = 0.80
COVERAGE_FAIL = 0.50


def draft_target_ids(d2t) -> list[int]:
    return [i + int(v) for i, v in enumerate(d2t)]


def check_mapping(ctx: Context) -> Check:
    d = ctx.draft
    draft_vocab = d.config.get("draft_vocab_size")
    vocab = ctx.target.get("vocab_size") if ctx.target is not None else d.get("vocab_size")
    d2t_hit, t2d_hit = d.find("d2t"), d.find("t2d")
    data = {"draft_vocab_size": draft_vocab, "target_vocab_size": vocab,
            "d2t": d2t_hit[1]["shape"] if d2t_hit else None, "t2d": t2d_hit[1]["shape"] if t2d_hit else None}
    too_large = draft_vocab is not None and vocab is not None and draft_vocab > vocab
    if d2t_hit is None:
        if draft_vocab is not None and vocab is not None and draft_vocab < vocab:
            return Check("mapping", FAIL, f"no d2t tensor but draft_vocab_size {draft_vocab} < vocab_size {vocab}:"
                         f" SGLang would take draft ids 0..{draft_vocab - 1} as target ids", data)
        if too_large:
            return Check("mapping", FAIL, f"no d2t tensor and draft_vocab_size {count(draft_vocab)} > the target's"
                         f" vocabulary {count(vocab)}: SGLang serves draft id i as target id i, and draft ids"
                         f" {count(vocab)}..{count(draft_vocab - 1)} are no token of the target", data)
        return Check("mapping", OK, "no d2t: the drafter predicts over the full target vocabulary", data)
    name, entry = d2t_hit
    if len(entry["shape"]) != 1 or entry["dtype"] not in ("I64", "I32"):
        return Check("mapping", FAIL, f"{name} is {entry['dtype']} {entry['shape']}, expected I64"
                     f" [draft_vocab_size {draft_vocab}]", data)
    n = entry["shape"][0]
    problems = [f"draft_vocab_size {count(draft_vocab)} > the target's vocabulary {count(vocab)}"] if too_large else []
    if draft_vocab is not None and n != draft_vocab:
        problems.append(f"{name} has {count(n)} entries, draft_vocab_size is {count(draft_vocab)}")
    target_ids = ctx.draft_ids = draft_target_ids(d.read(name))
    problems += map_problems(target_ids, vocab)
    t2d_note = "no t2d (SGLang does not read it)"
    if t2d_hit is not None:
        t2d_note, t2d_problems = t2d_agreement(d, t2d_hit, set(target_ids), draft_vocab, vocab)
        problems += t2d_problems
    ctx.map_valid = not problems
    if problems:
        return Check("mapping", FAIL, "; ".join(problems), data)
    return Check("mapping", OK, f"d2t maps {count(n)} draft ids to distinct target ids in"
                 f" 0..{count(max(target_ids)) if target_ids else 0}; {t2d_note}", data)


def map_problems(target_ids: list[int], vocab: int | None) -> list[str]:
    """Target ids outside the target vocabulary, or mapped twice."""
    problems = []
    bad = [(i, t) for i, t in enumerate(target_ids) if t < 0 or (vocab is not None and t >= vocab)]
    if bad:
        i, t = bad[0]
        problems.append(f"{plural(len(bad), 'target id')} out of range 0..{count(vocab - 1) if vocab else '?'}"
                        f" (first: draft id {i} -> {t})")
    seen: set = set()
    repeated = [(i, t) for i, t in enumerate(target_ids) if t in seen or seen.add(t)]
    if repeated:
        problems.append(f"{plural(len(repeated), 'duplicate target id')} (first: draft id {repeated[0][0]} ->"
                        f" {repeated[0][1]}, already mapped)")
    return problems


def t2d_agreement(d: Checkpoint, t2d_hit, distinct: set, draft_vocab, vocab) -> tuple[str, list[str]]:
    """(a note for the report, problems): t2d's shape, how many ids it marks, whether they are d2t's."""
    t_name, t_entry = t2d_hit
    if len(t_entry["shape"]) != 1 or (vocab is not None and t_entry["shape"][0] != vocab):
        return "", [f"{t_name} has shape {t_entry['shape']}, expected [target vocab {vocab}]"]
    marked = {j for j, v in enumerate(d.read(t_name)) if v}
    problems = []
    if draft_vocab is not None and len(marked) != draft_vocab:
        problems.append(f"{t_name} marks {count(len(marked))} ids, draft_vocab_size is {count(draft_vocab)}")
    only_t2d, only_d2t = marked - distinct, distinct - marked
    if only_t2d or only_d2t:
        problems.append(f"d2t and t2d disagree: {count(len(only_d2t))} ids only in d2t,"
                        f" {count(len(only_t2d))} only in t2d")
    return f"t2d marks the same {count(len(marked))} ids", problems


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
    return Check("coverage", coverage_status(share), f"{share:.1%} of the {count(len(tokens))} target tokens of"
                 f" {ctx.text_path.name} are in the draft vocabulary ({count(len(vocab))} ids; healthy:"
                 f" >= {COVERAGE_WARN:.0%})", {"share": round(share, 4), "tokens": len(tokens),
                                                "text": str(ctx.text_path)})


def coverage_status(share: float) -> str:
    """fail below COVERAGE_FAIL, warn below COVERAGE_WARN (each bound itself passes)."""
    return FAIL if share < COVERAGE_FAIL else WARN if share < COVERAGE_WARN else OK


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
    shared = len(set(draft_target_ids(a)) & set(draft_target_ids(b)))
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
