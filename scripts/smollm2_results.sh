#!/usr/bin/env bash
# Reproduces docs/results/smollm2/ (make smollm2-results): SmolLM2-135M-Instruct imported from the GGUF
# file that `make setup` installs, the English corpus, kvpress's environment, then each part of the
# frontier, the perplexity and the speed comparison. Each evaluation journals its finished rows under
# runs/kv_frontier/, so a stopped run continues where it stopped when this script is run again; the
# renders (only_finished=true) run nothing and name the rows not run yet. A fresh clone has no journal:
# each part first takes the rows of the committed reports under docs/results/smollm2/ that were measured
# under its settings on the same weights (kv_frontier.journal_from), so it measures only what they lack;
# FRESH=1 measures everything again.
set -euo pipefail
OUT=${OUT:-docs/results/smollm2}
source scripts/smollm2_setup.sh
make kvpress-env

EV=("$PY" evaluate.py suite=kv_frontier eval=smollm2 ckpt="$CKPT")
# the committed reports each journal continues from (none with FRESH=1)
seed() {
  local have=()
  for f in "$@"; do [ -f "docs/results/smollm2/$f/results.json" ] && have+=("docs/results/smollm2/$f/results.json"); done
  if [ -n "${FRESH:-}" ] || [ ${#have[@]} -eq 0 ]; then return; fi
  echo "+eval.kv_frontier.journal_from=[$(IFS=,; echo "${have[*]}")]"
}
CLASSIC_SEED=$(seed classic classic_long classic_16k)
# plain RoPE past 8,192 is another model there: its 16K rows come from its own report, not classic_16k's
PLAIN_SEED=$(seed classic classic_long classic_16k_plain_rope)
NATURAL_SEED=$(seed natural natural_long)
EV_CLASSIC=("${EV[@]}" ${CLASSIC_SEED:+"$CLASSIC_SEED"})
EV_PLAIN=("${EV[@]}" ${PLAIN_SEED:+"$PLAIN_SEED"})
EV_NATURAL=("${EV[@]}" ${NATURAL_SEED:+"$NATURAL_SEED"})
HAYSTACK=(eval.kv_frontier.passkey.filler=tokens +eval.kv_frontier.passkey.filler_path=data/english_docs/val.bin
          eval.kv_frontier.work_dir=runs/kv_frontier/smollm2_natural)
NATURAL=("${HAYSTACK[@]}" 'eval.kv_frontier.anchormass.shares=[1,2]'
         'eval.kv_frontier.anchormass.selections=[retrieval,index]' 'eval.kv_frontier.anchormass.group_sizes=[1,2,4,8]'
         'eval.kv_frontier.anchormass.no_outlier_group_sizes=[8]'
         'eval.kv_frontier.baseline_levels=[am/retrieval2/g4,am/retrieval2/g8,am/retrieval1/g8]' eval.kv_frontier.ppl=null)

# Beyond 1,024 tokens, the cells that recall anything at 1,024 and their matched baselines: two
# retrieval-chosen global groups at every G, g8 without outliers, every press at the g4 and g8 bytes.
LONG=('eval.kv_frontier.anchormass.shares=[2]' 'eval.kv_frontier.anchormass.selections=[retrieval]'
      'eval.kv_frontier.anchormass.group_sizes=[1,2,4,8]' 'eval.kv_frontier.anchormass.no_outlier_group_sizes=[8]'
      'eval.kv_frontier.anchormass.oracle_group_sizes=[]'
      'eval.kv_frontier.baseline_levels=[am/retrieval2/g4,am/retrieval2/g8]' eval.kv_frontier.ppl=null)

# 1. the classic filler at 1,024 tokens, every cell; then the held-out perplexity (1K-8K)
"${EV_CLASSIC[@]}" out_dir=runs/eval/smollm2_classic overwrite=true
# 2. the classic filler at 2K, 4K and 8K, one length at a time (each length's rows finish before the next starts).
#    The full cache and the KV policies share one prefill per trial, and so do kvpress's presses
#    (docs/method.md §6 k); each AnchorMass cell prefills on its own.
for L in 2048 4096 8192; do
  "${EV_CLASSIC[@]}" out_dir="runs/eval/smollm2_classic_L$L" overwrite=true "eval.kv_frontier.lengths=[$L]" "${LONG[@]}"
done
# 2b. beyond the trained length (8,192): the classic filler at 16K, with the project's NTK scaling (its
#     default there). The full cache alone first (the control), then the rest. kvpress runs the Llama
#     exported with our session's RoPE base at 16,384 tokens (the same model for these prompts,
#     docs/method.md §6 k). ObservedAttention reads the prefill's 16K x 16K attention weights per layer
#     (about 10 GB in fp32); kvpress's runner computes them a block of query rows at a time into one
#     reused tensor (scripts/peers/query_blocked_eager.py), which fits here.
"${EV_CLASSIC[@]}" out_dir=runs/eval/smollm2_classic_L16384_full overwrite=true 'eval.kv_frontier.lengths=[16384]' \
  "${LONG[@]}" 'eval.kv_frontier.anchormass.group_sizes=[]' 'eval.kv_frontier.anchormass.no_outlier_group_sizes=[]' \
  'eval.kv_frontier.baseline_levels=[]'
"${EV_CLASSIC[@]}" out_dir=runs/eval/smollm2_classic_L16384 overwrite=true 'eval.kv_frontier.lengths=[16384]' \
  "${LONG[@]}"
# 2c. 16K without the NTK scaling (plain RoPE past 8,192, transformers' default Llama there): the full
#     cache, the control of that condition (every run measures it), recalls 0/15 there. The one question it
#     can still answer is the write-up's (does the local/global split recall where the full cache cannot?),
#     so the lossless g1 cell runs beside it; the methods that keep or merge tokens at equal bytes are not
#     run in it.
PLAIN_CELLS=(eval.kv_frontier.rope_scaling=none 'eval.kv_frontier.lengths=[16384]' "${LONG[@]}"
             'eval.kv_frontier.anchormass.group_sizes=[1]' 'eval.kv_frontier.anchormass.no_outlier_group_sizes=[]'
             'eval.kv_frontier.baseline_levels=[]' eval.kv_frontier.kvpress.python=null)
"${EV_PLAIN[@]}" out_dir=runs/eval/smollm2_classic_L16384_plain overwrite=true "${PLAIN_CELLS[@]}"
# 3. the natural-text haystack (held-out English documentation) at 1,024 tokens, then the LONG set at 2K, 4K and 8K
"${EV_NATURAL[@]}" out_dir=runs/eval/smollm2_natural overwrite=true "${NATURAL[@]}"
for L in 2048 4096 8192; do
  "${EV_NATURAL[@]}" out_dir="runs/eval/smollm2_natural_L$L" overwrite=true "eval.kv_frontier.lengths=[$L]" \
    "${HAYSTACK[@]}" "${LONG[@]}"
done
# 4. the renders
"${EV_CLASSIC[@]}" eval.kv_frontier.only_finished=true out_dir="$OUT/classic" overwrite=true
"${EV_CLASSIC[@]}" eval.kv_frontier.only_finished=true out_dir="$OUT/classic_long" overwrite=true \
  'eval.kv_frontier.lengths=[1024,2048,4096,8192]' "${LONG[@]}"
"${EV_CLASSIC[@]}" eval.kv_frontier.only_finished=true out_dir="$OUT/classic_16k" overwrite=true \
  'eval.kv_frontier.lengths=[16384]' "${LONG[@]}"
"${EV_PLAIN[@]}" eval.kv_frontier.only_finished=true out_dir="$OUT/classic_16k_plain_rope" overwrite=true \
  "${PLAIN_CELLS[@]}"
"${EV_NATURAL[@]}" eval.kv_frontier.only_finished=true out_dir="$OUT/natural" overwrite=true "${NATURAL[@]}"
"${EV_NATURAL[@]}" eval.kv_frontier.only_finished=true out_dir="$OUT/natural_long" overwrite=true \
  'eval.kv_frontier.lengths=[1024,2048,4096,8192]' "${HAYSTACK[@]}" "${LONG[@]}"
# 5. speed on the same weights (run it on a quiet machine: it times)
"$PY" scripts/bench_hf.py ckpt="$CKPT" out="$OUT/efficiency" train_length=1024
