"""The layer ids: which target layers the drafter's ``eagle_aux_hidden_state_layer_ids`` make SGLang capture,
by the target class's own rule in the release at hand."""
from __future__ import annotations

import re

from sglang_pcie.tools.check_drafter.checkpoint import aux_count, draft_layer_ids
from sglang_pcie.tools.check_drafter.context import Context
from sglang_pcie.tools.check_drafter.report import FAIL, OK, SKIP, WARN, Check
from sglang_pcie.tools.check_drafter.sglang_facts import (CaptureRule, describe_points, documented_capture_rule,
                                                          sglang_capture_rule)


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
    L = ctx.target.get("num_hidden_layers")
    if not isinstance(L, int):
        return Check("layer ids", FAIL, f"target config has no num_hidden_layers ({L!r})", data)
    rule = target_rule(ctx, L)
    default_points = rule(None) or documented_capture_rule(L)(None)
    points = rule(ids) if ids is not None else default_points
    data.update(target_layers=L, rule=rule.source, capture_indices=points, default_indices=default_points)
    if points is None:
        return Check("layer ids", FAIL, f"{rule.source} rejects layer ids {ids}", data)
    words, _ = describe_points(points, L)
    data["captured"] = words
    said = (f"layer ids {ids} -> " if ids is not None else "no layer ids in the draft config: the target default"
            " [2, L//2, L-3] is in force -> ")
    failure = capture_failure(points, L, n_aux, rule)
    if failure:
        return Check("layer ids", FAIL, said + failure, data)
    same = ", as SGLang's default does" if ids is not None and points == default_points else ""
    summary = f"{said}captures {', '.join(words)} of {L}{same} (rule: {rule.source})"
    warnings = capture_warnings(ids, points, default_points, L)
    if warnings:
        return Check("layer ids", WARN, f"{summary}; " + "; ".join(warnings), data)
    return Check("layer ids", OK, summary, data)


def target_rule(ctx: Context, num_layers: int) -> CaptureRule:
    """The target class's own rule in this release, else SGLang's Llama rule (the source says which)."""
    arch = (ctx.target.config.get("architectures") or [None])[0]
    rule = None
    if ctx.facts is not None and arch:
        try:
            rule = sglang_capture_rule(ctx.facts, arch, ctx.target.config, ctx.target.text_config)
        except (SyntaxError, ValueError, TypeError):
            rule = None
    if rule is None:
        rule = documented_capture_rule(num_layers)
        if ctx.facts is not None:
            rule.source = (f"SGLang's Llama rule (id + 1), assumed: {arch} has no set_eagle3_layers_to_capture"
                           f" that runs alone in SGLang {ctx.facts.version}")
    return rule


def capture_failure(points: list[int], num_layers: int, n_aux: int, rule: CaptureRule) -> str | None:
    """Why these capture points cannot feed the drafter's fc, or None."""
    _, unreached = describe_points(points, num_layers)
    if unreached:
        return (f"layer-loop indices {unreached} are never reached in 0..{num_layers - 1}: only"
                f" {len(points) - len(unreached)} of {n_aux} aux states get captured ({rule.source})")
    if len(set(points)) != len(points):
        return (f"indices {points} repeat: the loop captures each layer once, so {len(set(points))} states reach an"
                f" fc built for {n_aux}")
    if len(points) != n_aux:
        return f"{len(points)} captures, but the drafter's fc takes {n_aux} aux states"
    # Up to 0.5.9 the loop captures ``hidden_states + residual`` before each layer, and residual is still None
    # before layer 0: capturing index 0 raises at the first forward.
    if 0 in points and re.search(r"append\(\s*hidden_states \+ residual\s*\)", rule.file_text):
        return ("loop index 0 (the embeddings) is captured as hidden_states + residual while residual is still"
                f" None: the first forward raises ({rule.source})")
    return None


def capture_warnings(ids, points: list[int], default_points: list[int], num_layers: int) -> list[str]:
    """What looks like a slip in ids that capture something: -1, unordered ids, the default shifted or moved."""
    warnings = []
    if ids and -1 in ids:
        warnings.append("-1 is not 'the last layer': it becomes loop index 0, the embeddings")
    if ids and not all(a < b for a, b in zip(ids, ids[1:])):
        warnings.append(f"ids {ids} are not ascending: SGLang concatenates the states in layer order")
    if ids and points != default_points:
        default_words, _ = describe_points(default_points, num_layers)
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
    return warnings
