"""draft-token-watch's runtime half: the test it applies to per-token counts (its false-warning bound under the
stated H0, checked by simulation; its power on a partly wrong map), and the watch driven through its ``verify``
and logits-processor wrappers with SGLang-shaped inputs on CPU tensors (torch from the SGLang 0.5.23 test env):
what it counts, when it takes its turn, that it never raises into SGLang, and that it stays silent where it does not
apply; the count's Triton kernel (Triton's interpreter) against numpy, compiled for GPUs, and through SGLang's own
LogitsProcessor.forward."""
from __future__ import annotations

import math
import re

import pytest

from sglang_pcie.patches.draft_token_watch import payload as dw

np = pytest.importorskip("numpy")


# ------------------------------------------------------------------------------------------ the test itself


def zipf_traffic(rng, vocab, proposals, exponent=1.1):
    """Proposals per token of a Zipf-distributed stream (the first drafts of real text are heavy-headed)."""
    weights = 1.0 / np.arange(1, vocab + 1) ** exponent
    return rng.multinomial(proposals, weights / weights.sum())


def healthy_accepts(rng, proposed, mean, floor_share=dw.FLOOR_SHARE):
    """Accepts of a drafter that satisfies H0: each token's acceptance drawn between floor_share * mean and 1."""
    p = np.clip(rng.beta(2, 2 / mean - 2 + 1e-9, len(proposed)), floor_share * mean * 1.01, 1.0)
    return rng.binomial(proposed, p)


def test_chernoff_tail_bounds_the_exact_binomial_tail():
    from math import comb

    for n, q in ((200, 0.01), (50, 0.1), (1000, 0.002)):
        mu = n * q
        for d in range(int(mu) + 1, int(mu) + 15):
            exact = sum(comb(n, k) * q ** k * (1 - q) ** (n - k) for k in range(d, n + 1))
            assert exact <= dw.chernoff_tail(mu, d) + 1e-15, (n, q, d)
    assert dw.chernoff_tail(5.0, 5) == 1.0 and dw.chernoff_tail(0.0, 1) == 0.0


def test_the_looks_spend_at_most_alpha_together():
    assert sum(dw.look_alpha(k) for k in range(1, 100_000)) < dw.ALPHA
    assert dw.look_alpha(1) > dw.look_alpha(2) > 0


def test_nothing_is_judged_before_enough_first_drafts():
    proposed = np.zeros(100, dtype=np.int64)
    proposed[:10] = (dw.MIN_PROPOSALS - 1) // 10
    assert dw.judge(proposed, np.zeros(100, dtype=np.int64)) is None


def test_nothing_accepted_at_all_is_left_to_the_accept_length_alarm():
    proposed = np.full(100, 50, dtype=np.int64)
    assert dw.judge(proposed, np.zeros(100, dtype=np.int64)) is None


def test_healthy_drafters_under_h0_never_warn_in_many_servers():
    """Simulated healthy servers (every token's acceptance at or above the floor, Zipf traffic, 20 looks each as
    counts grow): the false-warning bound is 1e-3 per server, so none of 300 may warn."""
    rng = np.random.default_rng(1)
    warned = 0
    for server in range(300):
        mean = rng.uniform(0.2, 0.9)
        proposed_total = zipf_traffic(rng, 4000, 60_000)
        accepted_total = healthy_accepts(rng, proposed_total, mean)
        for look in range(1, 21):  # the counts of a look are a thinning of the final ones
            share = look / 20
            proposed = rng.binomial(proposed_total, share)
            accepted = np.minimum(rng.binomial(accepted_total, share), proposed)
            finding = dw.judge(proposed, accepted, look)
            warned += bool(finding and finding["warn"])
    assert warned == 0


def context_buckets(rng, proposed):
    """The context buckets each token's proposals fell in, each proposal after a random verified token."""
    return np.array([len(set(rng.integers(0, dw.CONTEXT_BUCKETS, n).tolist())) for n in proposed])


@pytest.mark.parametrize("wrong_share", [0.1, 0.4])
@pytest.mark.parametrize("trials", ["proposals", "contexts"])
def test_a_partly_wrong_map_warns_and_names_its_most_drafted_wrong_tokens(wrong_share, trials):
    rng = np.random.default_rng(2)
    vocab = 4000
    proposed = zipf_traffic(rng, vocab, 20_000)
    accepted = healthy_accepts(rng, proposed, 0.7)
    wrong = rng.choice(vocab, int(wrong_share * vocab), replace=False)
    accepted[wrong] = 0  # a wrong map entry is rejected whatever the context
    contexts = context_buckets(rng, proposed) if trials == "contexts" else None
    finding = dw.judge(proposed, accepted, look=1, contexts=contexts)
    assert finding["warn"], finding
    assert set(t for t, _ in finding["top"]) <= set(wrong.tolist())
    assert finding["top"][0][1] == proposed[wrong].max()
    assert finding["dead_share"] >= dw.MIN_DEAD_SHARE


def test_a_few_rare_never_accepted_tokens_are_no_warning():
    """Below MIN_DEAD_SHARE of the first drafts the loss is not worth a warning, however sure the test is."""
    proposed = np.full(1000, 100, dtype=np.int64)
    accepted = np.full(1000, 60, dtype=np.int64)
    accepted[:10] = 0  # 1% of the first drafts
    finding = dw.judge(proposed, accepted)
    assert finding["dead"] == 10 and finding["tail"] < 1e-12 and not finding["warn"]
    accepted[:30] = 0  # 3%
    assert dw.judge(proposed, accepted)["warn"]


def test_fewer_than_three_never_accepted_tokens_are_no_warning_however_sure_and_large():
    proposed = np.full(102, 1000, dtype=np.int64)
    proposed[:3] = 2000
    accepted = proposed // 2
    accepted[:2] = 0  # two tokens, 3.8% of the first drafts, each proposed 2,000 times: P tiny
    finding = dw.judge(proposed, accepted)
    assert (finding["dead"], finding["warn"]) == (2, False)
    assert finding["tail"] < 1e-12 and finding["dead_share"] >= dw.MIN_DEAD_SHARE
    accepted[2] = 0
    assert dw.judge(proposed, accepted)["warn"]


def test_a_server_is_warned_once_whatever_later_looks_find():
    watch = dw.DraftWatch()
    proposed = np.full(100, 1000, dtype=np.int64)
    accepted = proposed // 2
    accepted[:5] = 0
    counts = np.concatenate([proposed, accepted, np.full(100, dw.CONTEXT_BUCKETS, dtype=np.int64)])
    watch.judge_counts(counts)
    watch.judge_counts(counts)
    assert watch.state == dw.WARNED and len(watch.lines) == 1 and watch.looks == 2
    assert watch.lines[0].startswith(f"{dw.LOG_PREFIX}: EAGLE drafter None proposes 5 target tokens as first drafts")


def test_a_token_is_tested_only_once_h0_makes_its_silence_unlikely():
    floor = dw.FLOOR_SHARE * 0.5
    needed = math.ceil(math.log(dw.Q_TESTED) / math.log(1 - floor))
    proposed = np.full(200, 40, dtype=np.int64)
    proposed[:20] = needed - 1
    accepted = np.full(200, 20, dtype=np.int64)  # every token accepted half the time ...
    accepted[:20] = 0  # ... but these 20, drafted once too few times to be tested
    accepted[20:] = (proposed[20:] * 0.5).astype(np.int64)
    total = proposed.sum()
    accepted[20:] = np.round(proposed[20:] * (0.5 * total / proposed[20:].sum())).astype(np.int64)
    finding = dw.judge(proposed, accepted)
    assert finding["dead"] == 0 and finding["tested"] == 180


def test_a_looks_lines_describe_the_counts_it_judged_not_the_verifies_since():
    """The read-back is judged verifies after the look took its counts: the H200 d2t 40% warning gave two counts of
    first drafts. The figures of a look's lines are those of the moment its counts were taken."""
    import logging

    proposed = np.full(250, 40, dtype=np.int64)
    accepted = np.full(250, 24, dtype=np.int64)
    accepted[:13] = 0  # 5.2% of the first drafts never accepted, in 40 contexts each
    watch = dw.DraftWatch()
    watch.logger = logging.getLogger("test-draft-watch")
    watch.calls, watch.turns, watch.own_seconds, watch.interval, watch.eager_verifies = 6_000, 300, 0.03, 0.008, 40
    watch.at_look = watch.figures()  # what the look's counts hold
    watch.calls, watch.turns, watch.eager_verifies = 6_021, 301, 41  # verified on while the copy came back
    watch.judge_counts(np.concatenate([proposed, accepted, np.full(250, 40, dtype=np.int64)]))
    assert watch.state == dw.WARNED and len(watch.lines) == 1
    assert re.findall(r"([\d,]+) counted first drafts", watch.lines[0]) == ["10,000"], watch.lines[0]
    assert "the 5,960 of 6,000 verifies run in CUDA graphs" in watch.lines[0]
    assert "0 of 40 run eagerly" in watch.lines[0] and "6,021" not in watch.lines[0]


def test_the_pages_context_buckets_before_a_token_is_tested_follow_from_the_constants():
    """docs/draft-token-watch.md: a wrong token is tested once H0 gives it at most Q_TESTED of never being accepted,
    (1 - FLOOR_SHARE p)^n <= Q_TESTED: n context buckets at first-draft acceptance p = 75% and 48%."""
    from support import REPO

    needed = [math.ceil(math.log(dw.Q_TESTED) / math.log1p(-dw.FLOOR_SHARE * p)) for p in (0.75, 0.48)]
    page = " ".join((REPO / "docs" / "draft-token-watch.md").read_text().split())
    assert needed == [23, 37] and f"proposed in {needed[0]}-{needed[1]} context buckets" in page


# ------------------------------------------------------------------------------------------ the wrapper


@pytest.fixture(scope="module")
def scenarios(sglang_env):
    """tests/support/scripts/draft_watch_scenarios.py in the real SGLang 0.5.23 install (torch on the CPU, the
    kernel in Triton's interpreter)."""
    return sglang_env("0.5.23")._json(sglang_env("0.5.23").run_script("draft_watch_scenarios.py"))


@pytest.mark.release
def test_the_kernel_counts_as_numpys_argmax_judges_leaving_padded_rows_and_foreign_ids_out(scenarios):
    """Ties (the first maximum agrees, as SGLang's argmax), bf16 logits in a view wider than the vocabulary, rows
    padded by SGLang's graph (seq_lens at the fill value, or 0), drafts outside the vocabulary."""
    kernel = scenarios["kernel"]
    assert kernel["proposed"] and kernel["agreed"] and kernel["contexts"]
    assert kernel["total"] == 24 - 2 - 3 and 0 < kernel["agreeing"] < kernel["total"]  # 2 foreign ids, 3 padded
    assert kernel["untouched"] == 0  # the buckets' sums are the read-back's, not the kernel's


@pytest.mark.release
def test_a_graph_takes_the_count_at_capture_and_eager_verifies_are_counted_on_the_watchs_turn(scenarios):
    captured = scenarios["capture"]
    assert captured["steps"] == [
        ["capture before set-up", False, 0, 1],  # [set up, graphs that took the count, graphs captured without]
        ["warm-up", True, 0, 0],  # SGLang's eager warm-up of the graph: set up, its padded rows not counted
        ["capture", 2, 1, 1],  # [first drafts, agreeing, graphs]: the padded third row left out
        ["eager", 5, 3, 6, 6],  # [first drafts, eager counted, eager verifies, verifies]: turns at verifies 1, 3, 6
    ]
    assert captured["proposed"] == [5, 6, 10, 12, 15] and captured["state"] == dw.WATCHING
    assert "1 graphs took the count, 1 captured before it could count" in captured["cost"]


@pytest.mark.release
def test_a_partly_wrong_map_is_named_once_with_the_check_drafter_command(scenarios):
    wrong = scenarios["wrong"]
    assert wrong["state"] == dw.WARNED and len(wrong["lines"]) == 1 and wrong["top"] == [3, 13, 23, 33]
    assert "never accepted" in wrong["lines"][0]
    assert "sglang-pcie check-drafter --draft /m/draft --target /m/target" in wrong["lines"][0]
    assert len(re.findall(r"([\d,]+) counted first drafts", wrong["lines"][0])) == 1


@pytest.mark.release
def test_a_healthy_drafter_is_never_named(scenarios):
    healthy = scenarios["healthy"]
    assert healthy["state"] == dw.WATCHING and healthy["lines"] == [] and healthy["looks"] >= 3


@pytest.mark.release
def test_misses_repeated_in_one_context_are_no_warning(scenarios):
    """The false warnings of the first H200 run: the tokenwise pair's healthy drafter misses a fifth of its tokens
    in their one context, every time; counted per context, those tokens are never tested."""
    repeated = scenarios["repeated_contexts"]
    assert repeated["state"] == dw.WATCHING and repeated["lines"] == [] and repeated["looks"] >= 1
    assert "0 tokens tested" in repeated["logged"][0]


@pytest.mark.release
def test_looks_one_two_four_log_the_watchs_own_measured_cost_at_info(scenarios):
    logged = scenarios["healthy"]["logged"]
    assert [line.split(":")[1].strip() for line in logged] == [f"look {k}" for k in (1, 2, 4, 8, 16)
                                                                 if k <= scenarios["healthy"]["looks"]]
    assert all("no warning" in line and "us per turn" in line and "of the time between verifies" in line
               and "run in CUDA graphs" in line for line in logged)


@pytest.mark.release
def test_takes_its_turn_so_that_its_measured_time_stays_under_its_share_of_the_verify_interval(scenarios):
    stride = scenarios["stride"]
    assert stride["stride"] == stride["expected"] == 4  # 20 us of 10 ms at 0.05%: one verify in 4
    assert stride["cost_share"] <= dw.COST_SHARE * 1.15  # the 50 ms set-up is not charged per turn
    assert stride["turns"] < stride["calls"] / 3
    assert stride["setup"] == pytest.approx(0.05, rel=1e-6)  # measured apart, and logged so
    assert stride["cost_text"].endswith("; set-up 50.0 ms once")


@pytest.mark.release
@pytest.mark.parametrize("case", ["tp1", "tree", "ngram", "tree_worker"])
def test_other_tp_ranks_trees_and_other_verify_inputs_are_left_alone_silently(scenarios, case):
    left = scenarios[case]
    assert left["state"] == dw.OFF and left["lines"] == [] and left["counts"] is True
    assert left["calls_after"] == left["calls_before"]  # off: the wrapper only calls SGLang's method


@pytest.mark.release
def test_v1_passes_the_verify_input_it_is_called_with_through(scenarios):
    """0.5.8-0.5.11 call ``verify(batch, spec_info)`` with ``batch.spec_info`` still the draft input: the turn
    reads neither; the count reads the target's verify forward."""
    assert scenarios["v1_spec_info"] == {"state": dw.WATCHING, "lines": [], "seen": ["the verify input"],
                                         "result": "result", "proposed": 2}


@pytest.mark.release
def test_the_tp_rank_comes_from_sglangs_parallel_state_where_the_worker_has_none(scenarios):
    """0.5.23's EAGLEWorkerV2 (the real class) has no tp_rank: every rank would count and warn. Rank 1, as SGLang's
    runtime context says, is left alone; rank 0 watches."""
    ranks = scenarios["rank_from_sglang"]
    assert ranks["has_tp_rank"] is False
    assert ranks["rank_1"] == {"state": dw.OFF, "bound": False, "lines": []}
    assert ranks["rank_0"] == {"state": dw.WATCHING, "bound": True, "lines": []}


@pytest.mark.release
def test_an_error_turns_the_watch_off_with_one_line_and_never_reaches_sglang(scenarios):
    error = scenarios["error"]
    assert error["returned"] == ["result", "result"] and error["state"] == dw.OFF
    assert len(error["lines"]) == 1 and error["lines"][0].startswith(f"{dw.LOG_PREFIX}: off:")


@pytest.mark.release
def test_verifies_without_drafts_are_skipped_not_an_error(scenarios):
    """With adaptive steps at 0 SGLang verifies one token per request and no draft: nothing to count, no line."""
    assert scenarios["no_drafts"] == {"state": dw.WATCHING, "lines": [], "total": 2}


@pytest.mark.release
def test_prefill_decode_and_idle_forwards_pass_the_logits_processor_untouched(scenarios):
    assert scenarios["other_forwards"] == {"state": dw.WATCHING, "set_up": False, "lines": []}


@pytest.mark.release
def test_the_counts_are_read_back_at_doubling_spacings_up_to_look_seconds(scenarios):
    # a verify each 0.1 s: read-backs 1, 2, 4, 8 s apart as turns fall, then every 10 s (look_seconds)
    assert scenarios["read_backs"] == [1.1, 2.2, 4.5, 9.1, 18.2, 28.2, 38.2]


@pytest.mark.release
@pytest.mark.parametrize("version", ["0.5.9", "0.5.23"])
def test_sglangs_own_logits_processor_is_counted_as_its_logits_say_and_returns_them_unchanged(sglang_env, version):
    """Through SGLang's LogitsProcessor.forward as the overlay's start-up hook wrapped it (0.5.9: v1 and v2
    workers; 0.5.23): a target verify forward with SGLang's ForwardBatch and EagleVerifyInput. The first call, not
    the watch's turn, sets the counts up and counts nothing; the turn counts each request's first draft and whether
    it is the argmax of SGLang's own logits at the verified token, the padded row left out; a decode forward passes
    untouched; the logits are SGLang's, bit for bit."""
    seen = sglang_env(version).run_script_json("draft_watch_logits_processor.py")
    assert seen["patched"] is True and seen["set_up"] == {"counts": True, "counted": 0}
    assert seen["same_logits"] is True
    assert seen["proposed"] is True and seen["agreed"] is True
    assert seen["total"] == 4 and seen["agreeing"] >= 3 and seen["eager_counted"] == 1  # 5 requests, 1 padded
    assert seen["state"] == dw.WATCHING and seen["lines"] == []


@pytest.mark.release
def test_a_server_whose_verifies_never_reach_the_count_says_so_once(scenarios):
    uncounted = scenarios["uncounted"]
    assert uncounted["state"] == dw.WATCHING and uncounted["lines"] == []
    assert len(uncounted["logged"]) == 1 and "counts nothing in this server" in uncounted["logged"][0]


@pytest.mark.release
@pytest.mark.parametrize("version", ["0.5.9", "0.5.23"])
def test_the_count_kernel_compiles_for_the_gpus_served_with_64_bit_relaxed_atomics(sglang_env, version):
    """The interpreter runs the kernel's logic on the CPU; this compiles it as a GPU server would (Triton 3.5 and
    3.8, sm_80 to sm_120, cubin included): a type Triton rejects on a GPU fails here, not in a server's capture."""
    compiled = sglang_env(version).run_script_json("verify_count_compiles.py")
    for arch in ("80", "90", "100", "120"):
        assert compiled[arch] == {"cubin": True, "atomics": ["atom.global.gpu.relaxed.add.u64"], "byte_stores": 1}


@pytest.mark.release
def test_a_vocabulary_shard_turns_the_count_off_with_a_line_and_a_compiled_trace_is_left_alone(scenarios):
    seen = scenarios["shard_and_compiled"]
    assert seen["compiled"] == {"state": dw.WATCHING, "set_up": False}
    assert seen["shard"]["state"] == dw.OFF and seen["shard"]["set_up"] is False
    assert len(seen["shard"]["lines"]) == 1 and "hold 50 of the 100 tokens" in seen["shard"]["lines"][0]
