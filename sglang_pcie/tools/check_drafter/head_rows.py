"""Whether the drafter's lm_head rows mean the tokens its d2t says, with no tokenizer and no reference drafter.

Row ``i`` of the drafter's lm_head scores draft id ``i``, which SGLang serves as target id ``i + d2t[i]``. Where
the rows were made from the target's (copied from its embedding or lm_head rows, or trained on from them), row
``i`` resembles the target's row of that id, and only of that id. A valid but wrong map (permuted within its own
hot set, regenerated after training) pairs each row with another token's. Two tests on a sample of draft ids, each
against the same sample with the map shuffled:

- rows (same width only): does each sampled row resemble its own target row more than the other sampled ones?
- structure (any width): do the sampled rows resemble one another as their target rows do? (A drafter trained in a
  basis of its own may keep the target's similarity structure; this is not measured on real drafters.)

Where neither finds the rows related to the target's under the map, two more looks tell a wrong map from an
unrelated head: the map shifted by one position, and for a few rows a scan of every target row the map names.
Where nothing relates the rows to the target's (a random head, or one trained in its own basis), the check says it
cannot tell. Bounded: ``SAMPLE`` rows of ``COLUMNS`` values per matrix, then at most ``SEARCH_LIMIT`` rows of
``SEARCH_COLUMNS`` values; pure Python, no weights loaded.
"""
from __future__ import annotations

import operator
import random
import statistics
from dataclasses import dataclass

from sglang_pcie.tools.check_drafter.context import Context
from sglang_pcie.tools.check_drafter.model_checks import head_and_embeddings, shape
from sglang_pcie.tools.check_drafter.report import FAIL, OK, SKIP, WARN, Check, count

NAME = "lm_head rows"
SAMPLE = 64  # draft ids compared
COLUMNS = 256  # values of each row compared, spread over the row
LINE_UP_Z = 5.0  # a row lines up: its own target row scores this many SDs above the shuffled pairs, and highest
MIN_SHARE = 0.9  # share of the sampled rows that must line up for "ok"
RELATED_SHARE = 0.25  # this share lining up shows a related head, even where the rest does not line up
STRUCTURE_Z = 5.0  # the structure's correlation this many SDs above shuffled maps'
PERMUTATIONS = 100
SEARCHED_ROWS = 8  # rows scanned against every target row the map names
SEARCH_COLUMNS = 64  # the first values of each row, for the scan (a perfect match: 8 SDs)
SEARCH_LIMIT = 65_536  # target rows scanned at most (a draft vocabulary is 32k ids or fewer)
SEARCH_Z = 6.0  # a match stands out this many SDs above the scanned rows (false alarm ~1e-9 per row scanned)
FLOAT_TYPES = ("BF16", "F16", "F32")


@dataclass
class Reference:
    """A target matrix with one row per target id: its embedding table or its lm_head."""

    label: str
    name: str
    width: int


def check_head_rows(ctx: Context) -> Check | None:
    why = cannot_compare(ctx)
    if why:
        return Check(NAME, SKIP, why)
    d = ctx.draft
    head, (vocab_rows, width) = shape(d, "lm_head.weight")
    target_ids = ctx.draft_ids if ctx.draft_ids is not None else list(range(vocab_rows))
    ids = sample_ids(len(target_ids))
    rows = unit_rows(d.rows(head, ids, spread(width)))
    if sum(r is None for r in rows) > len(rows) // 2:
        return Check(NAME, SKIP, f"cannot tell: the {len(ids)} sampled lm_head rows are zero (a placeholder?)")
    data: dict = {"sampled": len(ids), "columns": len(spread(width))}
    verdicts = []
    for ref in references(ctx):
        found = compare(ctx, ref, rows, [target_ids[i] for i in ids], width)
        if found is not None:
            data[ref.label] = found
            verdicts.append((ref, found))
    if not verdicts:
        return Check(NAME, SKIP, "cannot tell: the sampled target rows are zero (a placeholder target?)", data)
    return verdict(ctx, head, width, ids, target_ids, rows, verdicts, data)


def cannot_compare(ctx: Context) -> str | None:
    """Why the rows cannot be compared here, or None."""
    if ctx.target is None:
        return "give --target to compare the lm_head rows with the target's"
    head_from, _, _ = head_and_embeddings(ctx.draft)
    if head_from == "target":
        return "the drafter takes the target's lm_head (no draft_vocab_size): its rows are the target's"
    if head_from == "embeddings":
        return "lm_head is the embedding table (tie_word_embeddings): see embeddings"
    hit = ctx.draft.find("lm_head.weight")
    if hit is None or len(hit[1]["shape"]) != 2 or hit[1]["dtype"] not in FLOAT_TYPES:
        return "no 2-D float lm_head.weight to compare (see embeddings)"
    if ctx.draft.find("d2t") is not None and not ctx.map_valid:
        return "the d2t map is not valid (see mapping)"
    if len(ctx.draft_ids or range(hit[1]["shape"][0])) < 8:
        return "fewer than 8 draft ids: too few to compare"
    if not references(ctx):
        return "cannot tell: the target has no float embed_tokens / lm_head with a row per token"
    return None


def references(ctx: Context) -> list[Reference]:
    found = []
    for label in ("embed_tokens", "lm_head"):
        hit = ctx.target.find(f"{label}.weight")
        vocab = ctx.target.get("vocab_size")
        if hit and len(hit[1]["shape"]) == 2 and hit[1]["dtype"] in FLOAT_TYPES and (
                vocab is None or hit[1]["shape"][0] >= vocab):
            found.append(Reference(label, hit[0], hit[1]["shape"][1]))
    return found


def sample_ids(n: int) -> list[int]:
    """SAMPLE draft ids spread over 0..n-1 (all of them when fewer)."""
    return sorted({k * n // SAMPLE for k in range(SAMPLE)}) if n > SAMPLE else list(range(n))


def spread(width: int) -> list[int]:
    return [k * width // COLUMNS for k in range(COLUMNS)] if width > COLUMNS else list(range(width))


def unit_rows(rows: list[list[float]]) -> list[list[float] | None]:
    """Each row scaled to length 1 (None for a zero row)."""
    found = []
    for row in rows:
        norm = sum(map(operator.mul, row, row)) ** 0.5
        found.append([v / norm for v in row] if norm > 0 else None)
    return found


def dot(a, b) -> float:
    return sum(map(operator.mul, a, b))


def compare(ctx: Context, ref: Reference, rows: list, mapped: list[int], width: int) -> dict | None:
    """The two tests for the sampled rows against the target rows ``mapped`` names (None: those are zero)."""
    theirs = unit_rows(ctx.target.rows(ref.name, mapped, spread(ref.width)))
    kept = [k for k, (a, b) in enumerate(zip(rows, theirs)) if a is not None and b is not None]
    if len(kept) < 8:
        return None
    mine, theirs = [rows[k] for k in kept], [theirs[k] for k in kept]
    found = {"structure": structure_test(mine, theirs)}
    if ref.width == width:
        found["rows"] = row_test(mine, theirs)
        found["rows"]["not_lined_up"] = [kept[i] for i in found["rows"]["not_lined_up"]]
    return found


def row_test(mine: list, theirs: list) -> dict:
    """How many rows score their own target row highest, and LINE_UP_Z SDs above the shuffled pairs."""
    scores = [[dot(a, b) for b in theirs] for a in mine]
    shuffled = [scores[i][j] for i in range(len(mine)) for j in range(len(mine)) if i != j]
    mean, sd = statistics.fmean(shuffled), statistics.pstdev(shuffled)
    threshold = mean + LINE_UP_Z * sd
    own = [scores[i][i] for i in range(len(mine))]
    lined = [i for i in range(len(mine)) if own[i] >= threshold and own[i] >= max(scores[i])]
    return {"lined_up": len(lined), "of": len(mine), "own_median": round(statistics.median(own), 3),
            "shuffled_mean": round(mean, 3), "shuffled_sd": round(sd, 3), "threshold": round(threshold, 3),
            "not_lined_up": [i for i in range(len(mine)) if i not in lined]}


def structure_test(mine: list, theirs: list) -> dict:
    """Correlation of the rows' pairwise similarities with their target rows', against shuffled maps."""
    n = len(mine)
    pairs = [(a, b) for a in range(n) for b in range(a + 1, n)]
    ours = [dot(mine[a], mine[b]) for a, b in pairs]
    target = [dot(theirs[a], theirs[b]) for a, b in pairs]
    gram = [[1.0] * n for _ in range(n)]
    for (a, b), value in zip(pairs, target):
        gram[a][b] = gram[b][a] = value
    mean_ours, sd_ours = statistics.fmean(ours), statistics.pstdev(ours)
    sd_target = statistics.pstdev(target)
    if sd_ours == 0 or sd_target == 0:
        return {"r": 0.0, "null_mean": 0.0, "null_sd": 0.0, "z": 0.0, "pairs": len(pairs)}
    centred = [(v - mean_ours) / (sd_ours * sd_target * len(pairs)) for v in ours]  # r = sum(centred * target)

    def r_of(order):
        return dot(centred, [gram[order[a]][order[b]] for a, b in pairs])

    rng = random.Random(0)
    null = [r_of(rng.sample(range(n), n)) for _ in range(PERMUTATIONS)]
    null_mean, null_sd = statistics.fmean(null), statistics.pstdev(null)
    r = r_of(range(n))
    return {"r": round(r, 3), "null_mean": round(null_mean, 3), "null_sd": round(null_sd, 3),
            "z": round((r - null_mean) / null_sd, 1) if null_sd else 0.0, "pairs": len(pairs)}


# -- the verdict


def lines_up(found: dict) -> bool:
    rows = found.get("rows")
    return rows is not None and rows["lined_up"] >= MIN_SHARE * rows["of"]


def agrees(found: dict) -> bool:
    return found["structure"]["z"] >= STRUCTURE_Z


def rows_words(ref: Reference, found: dict) -> str:
    rows = found["rows"]
    return (f"{rows['lined_up']} of {rows['of']} line up with the target's {ref.label} rows, own row cos median"
            f" {rows['own_median']:.2f} vs shuffled pairs {rows['shuffled_mean']:.2f} +- {rows['shuffled_sd']:.2f}"
            f" (a row needs > {rows['threshold']:.2f} and the top score of {rows['of']})")


def structure_words(ref: Reference, found: dict) -> str:
    structure = found["structure"]
    return (f"similarity structure against the target's {ref.label} rows r {structure['r']:.2f} vs"
            f" {structure['null_mean']:.2f} +- {structure['null_sd']:.2f} for {PERMUTATIONS} shuffled maps"
            f" ({count(structure['pairs'])} pairs)")


def best_words(verdicts: list) -> str:
    """What both tests found against each of the target's matrices compared, for a verdict that found nothing: every
    reference, in one order (embed_tokens, then lm_head, as ``references`` lists them), whichever came closest, so
    that two drafters' lines name the rows compared the same way."""
    return "; ".join(part for ref, found in verdicts
                     for part in ([rows_words(ref, found)] if found.get("rows") else []) + [structure_words(ref, found)])


def verdict(ctx: Context, head: str, width: int, ids: list[int], target_ids: list[int], rows: list,
            verdicts: list, data: dict) -> Check:
    """In order: the rows line up; some do (the others scanned); the structure agrees; d2t shifted by one fits;
    a scan finds the rows' tokens elsewhere; else cannot tell."""
    for ref, found in verdicts:
        if lines_up(found):
            return Check(NAME, OK, f"under d2t, {rows_words(ref, found)}", data)
    thresholds = [(ref, found["rows"]["threshold"]) for ref, found in verdicts if found.get("rows")]
    related = [found for _, found in verdicts if found.get("rows")
               and found["rows"]["lined_up"] >= RELATED_SHARE * found["rows"]["of"]]
    if related:
        positions = related[0]["rows"]["not_lined_up"][:SEARCHED_ROWS]
        scanned = search(ctx, head, width, [ids[k] for k in positions], target_ids, thresholds)
        if scanned:
            return elsewhere(scanned, verdicts, data)
        return Check(NAME, WARN, f"under d2t only some rows line up, the others fit no target row the map names:"
                     f" cannot tell whether those positions are wrong ({best_words(verdicts)})", data)
    for ref, found in verdicts:
        if agrees(found):
            return Check(NAME, OK, f"under d2t the {len(ids)} sampled rows resemble one another as their target"
                         f" rows do: {structure_words(ref, found)}", data)
    for shift in (-1, 1):
        shifted = shift_test(ctx, verdicts, ids, target_ids, rows, width, shift)
        if shifted:
            data["shifted"] = {"by": shift, **shifted[1]}
            tests = rows_words(*shifted) if lines_up(shifted[1]) else structure_words(*shifted)
            return Check(NAME, FAIL, f"the rows fit d2t shifted by one position: draft id i's row belongs to the"
                         f" target id d2t gives draft id i{shift:+d} ({tests}; under d2t itself"
                         f" {best_words(verdicts)}): SGLang would serve each draft token as its neighbour's", data)
    scanned = search(ctx, head, width, ids[:SEARCHED_ROWS], target_ids, thresholds)
    if scanned:
        return elsewhere(scanned, verdicts, data)
    return Check(NAME, SKIP, f"cannot tell: under d2t {best_words(verdicts)}; nothing better under d2t shifted by"
                 f" one, nor among the {count(len(set(target_ids)))} target rows the map names for"
                 f" {min(SEARCHED_ROWS, len(ids))} rows scanned. A head trained in its own basis (or a random one)"
                 " looks like this: check the map with --compare-d2t or a tokenizer.json", data)


def elsewhere(scanned: dict, verdicts: list, data: dict) -> Check:
    data["elsewhere"] = scanned
    first = scanned["matches"][0]
    return Check(NAME, FAIL, f"the rows fit other target ids than d2t says: draft id {count(first['draft_id'])}'s row"
                 f" is the target's {scanned['reference']} row of id {count(first['matches'])} (cos"
                 f" {first['cos']:.2f}, {first['z']:.0f} SDs above the {count(scanned['scanned'])} rows the map names),"
                 f" d2t maps it to {count(first['d2t'])} (cos {first['mapped_cos']:.2f}); {len(scanned['matches'])}"
                 f" of {scanned['searched']} rows scanned fit elsewhere; under d2t {best_words(verdicts)}", data)


def shift_test(ctx: Context, verdicts: list, ids: list[int], target_ids: list[int], rows: list, width: int,
               shift: int):
    """(reference, tests) where the rows line up (or agree) with the map moved by ``shift`` positions, or None."""
    kept = [k for k, i in enumerate(ids) if 0 <= i + shift < len(target_ids)]
    for ref, _ in verdicts:
        found = compare(ctx, ref, [rows[k] for k in kept], [target_ids[ids[k] + shift] for k in kept], width)
        if found and (lines_up(found) or agrees(found)):
            return ref, found
    return None


def search(ctx: Context, head: str, width: int, draft_ids: list[int], target_ids: list[int],
           refs: list[tuple[Reference, float]]) -> dict | None:
    """Scan every target row the map names (SEARCH_LIMIT at most) for the best match of a few draft rows, on their
    first SEARCH_COLUMNS values: a match stands out SEARCH_Z SDs above the rows scanned, is not the mapped row,
    and on COLUMNS values clears the row test's threshold for a row lining up (and beats the mapped row)."""
    columns = list(range(min(SEARCH_COLUMNS, width)))
    queries = unit_rows(ctx.draft.rows(head, draft_ids, columns))
    candidates = sorted(set(target_ids))[:SEARCH_LIMIT]
    for ref, threshold in refs:
        best = [(-2.0, -1)] * len(draft_ids)
        total, squares = [0.0] * len(draft_ids), [0.0] * len(draft_ids)
        for start in range(0, len(candidates), 4096):
            chunk = candidates[start:start + 4096]
            for target_id, row in zip(chunk, ctx.target.rows(ref.name, chunk, columns)):
                norm = dot(row, row) ** 0.5 or 1.0
                for q, query in enumerate(queries):
                    score = dot(query, row) / norm if query else 0.0
                    total[q], squares[q] = total[q] + score, squares[q] + score * score
                    if score > best[q][0]:
                        best[q] = (score, target_id)
        matches = confirmed(ctx, head, width, (ref, threshold), draft_ids, target_ids, best, total, squares,
                            len(candidates))
        if matches:
            return {"reference": ref.label, "scanned": len(candidates), "searched": len(draft_ids),
                    "matches": matches}
    return None


def confirmed(ctx: Context, head: str, width: int, reference, draft_ids, target_ids, best, total, squares,
              scanned: int) -> list[dict]:
    """The scan's best matches that stand out, are not the mapped row, and hold on COLUMNS values."""
    ref, threshold = reference
    found = []
    for q, (score, target_id) in enumerate(best):
        mean = total[q] / scanned
        sd = max(squares[q] / scanned - mean * mean, 0.0) ** 0.5
        mapped = target_ids[draft_ids[q]]
        if sd == 0 or (score - mean) / sd < SEARCH_Z or target_id == mapped:
            continue
        full = unit_rows(ctx.draft.rows(head, [draft_ids[q]], spread(width))
                         + ctx.target.rows(ref.name, [target_id, mapped], spread(ref.width)))
        if None in full or dot(full[0], full[1]) < max(threshold, dot(full[0], full[2])):
            continue
        found.append({"draft_id": draft_ids[q], "matches": target_id, "d2t": mapped,
                      "cos": round(dot(full[0], full[1]), 3), "mapped_cos": round(dot(full[0], full[2]), 3),
                      "z": round((score - mean) / sd, 1)})
    return found
