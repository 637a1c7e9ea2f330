#!/usr/bin/env bash
# Reproduces docs/results/smollm2/retrofit/ (make smollm2-retrofit): SmolLM2-135M-Instruct retrofitted
# into AnchorMass by configs/curriculum/retrofit_smollm2.yaml, then every finished cell scored beside
# the training-free methods on the frontier's own passkey trials and perplexity anchors.
#   1. the imports: imports/smollm2 (index order) and imports/smollm2_retrieval2, whose two global KV
#      groups per layer are the ones the frontier's retrieval score chose (read from the committed
#      docs/results/smollm2/classic/results.json, so the cells train with the groups that were scored);
#   2. the cells (a rerun skips finished stages and resumes a stopped one);
#   3. the scores: the frontier's classic journal (its full-cache and press rows are reused; only the
#      cells' rows are new), rendered into docs/results/smollm2/retrofit/. A fresh clone's journal first
#      takes the committed classic reports' rows (kv_frontier.journal_from; FRESH=1 measures them again);
#   4. every cell at 16K, beyond the trained length (scores_16k/).
set -euo pipefail
OUT=${OUT:-docs/results/smollm2/retrofit}
LENGTHS=${LENGTHS:-[1024,2048,4096,8192]}
source scripts/smollm2_setup.sh

if [ ! -f imports/smollm2_retrieval2/model.ckpt ]; then
  GLOBAL_GROUPS=$("$PY" -c "
import json, torch
from anchormass.eval.suites.kv_frontier.variants import chosen_groups
scores = json.load(open('docs/results/smollm2/classic/results.json'))['suites']['kv_frontier']['settings']['retrieval_scores']
print(json.dumps(chosen_groups(torch.tensor(scores), 2, 'retrieval')).replace(' ', ''))")
  "$PY" scripts/import_hf.py src="$GGUF" out=imports/smollm2_retrieval2 "global_groups=$GLOBAL_GROUPS"
fi

"$PY" scripts/run_curriculum.py curriculum=retrofit_smollm2

mapfile -t CELLS < <("$PY" scripts/retrofit_cells.py curriculum=retrofit_smollm2)
[ ${#CELLS[@]} -gt 0 ] || { echo "error: no finished retrofit cell to score" >&2; exit 2; }
SEED=()
SEED16=()
if [ -z "${FRESH:-}" ]; then
  SEED=("+eval.kv_frontier.journal_from=[docs/results/smollm2/classic/results.json,docs/results/smollm2/classic_long/results.json]")
  SEED16=("+eval.kv_frontier.journal_from=[docs/results/smollm2/classic_16k/results.json]")
fi
EV=("$PY" evaluate.py suite=kv_frontier eval=smollm2 ckpt="$CKPT" "eval.kv_frontier.lengths=$LENGTHS" "${SEED[@]}"
    'eval.kv_frontier.anchormass.shares=[2]' 'eval.kv_frontier.anchormass.selections=[retrieval]'
    'eval.kv_frontier.anchormass.group_sizes=[1,2,4,8]' 'eval.kv_frontier.anchormass.no_outlier_group_sizes=[8]'
    'eval.kv_frontier.anchormass.oracle_group_sizes=[]'
    'eval.kv_frontier.baseline_levels=[am/retrieval2/g4,am/retrieval2/g8]' "${CELLS[@]}")
CELL_NAMES=$(printf '%s\n' "${CELLS[@]}" | sed 's/^+eval.kv_frontier.trained.\([^=]*\)=.*/trained\/\1/' | paste -sd, -)
"${EV[@]}" out_dir=runs/eval/smollm2_retrofit overwrite=true "eval.kv_frontier.ppl.cells=[am/retrieval2/g8,$CELL_NAMES]"
"${EV[@]}" out_dir="$OUT" overwrite=true eval.kv_frontier.only_finished=true "eval.kv_frontier.ppl.cells=[am/retrieval2/g8,$CELL_NAMES]"
# 4. beyond the trained length: every cell at 16K on the classic filler, with the NTK scaling as the
#    training-free 16K part (scripts/smollm2_results.sh); the cells only, beside the full cache's row.
BEYOND=("$PY" evaluate.py suite=kv_frontier eval=smollm2 ckpt="$CKPT" 'eval.kv_frontier.lengths=[16384]' "${SEED16[@]}"
        'eval.kv_frontier.anchormass.group_sizes=[]' 'eval.kv_frontier.anchormass.no_outlier_group_sizes=[]'
        'eval.kv_frontier.anchormass.oracle_group_sizes=[]' 'eval.kv_frontier.baseline_levels=[]'
        eval.kv_frontier.kvpress.python=null eval.kv_frontier.ppl=null "${CELLS[@]}")
"${BEYOND[@]}" out_dir=runs/eval/smollm2_retrofit_16k overwrite=true
"${BEYOND[@]}" out_dir="$OUT/scores_16k" overwrite=true eval.kv_frontier.only_finished=true
