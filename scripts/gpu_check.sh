#!/usr/bin/env bash
# The GPU acceptance run: the CUDA tests, then one table of kernel differences, training
# throughput/MFU/memory, prefill and decode from 4K to 256K, and the benchmark ratios.
#
#   scripts/gpu_check.sh                 # one H100/H200; stops starting items after 450 s, killed at 480 s
#   scripts/gpu_check.sh dry_run=true    # CPU, tiny models, 1-2 minutes: checks the run's own logic
#
# Extra key=value options go to the driver (anchormass/bench/gpu_check.py lists them).
# The table is printed and written to outputs/gpu_check/table.md (rows.json beside it). Exit status
# 1 when an item failed, was skipped for time or was stopped.
set -u
cd "$(dirname "$0")/.."
PY="${PYTHON:-python}"
LIMIT="${GPU_CHECK_LIMIT_S:-480}"
case " $* " in *" dry_run=true "*|*" dry_run=True "*) LIMIT="${GPU_CHECK_LIMIT_S:-1200}" ;; esac
# SIGTERM at the limit: the driver prints what it has; SIGKILL 20 s later if it cannot.
exec timeout -k 20 "$LIMIT" "$PY" -m anchormass.bench.gpu_check "$@"
