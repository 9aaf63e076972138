# Sourced by the GPU scripts that start servers on make-test-models pairs (gpu_tune_spec.sh, gpu_draft_watch.sh,
# gpu_map_check_pairs.sh): the one "user's launch" they all measure, so that their figures stay comparable.
# EAGLE-3, 3 steps, top-k 1, 4 draft tokens, TP1, triton attention, CUDA graphs at batch 1 and 32 only (the pairs'
# tests need the padding edge at batch 2: levels.edge_levels), at most 32 running requests.
user_launch() {  # $1: a make-test-models folder (target/ and draft/)
  echo --model-path "$1/target" --speculative-algorithm EAGLE3 --speculative-draft-model-path "$1/draft" \
    --speculative-num-steps 3 --speculative-eagle-topk 1 --speculative-num-draft-tokens 4 --tp-size 1 \
    --attention-backend triton --skip-tokenizer-init --mem-fraction-static 0.6 --max-running-requests 32 \
    --cuda-graph-bs-decode 1 32 --disable-prefill-cuda-graph
}
