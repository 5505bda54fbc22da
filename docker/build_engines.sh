#!/usr/bin/env bash
# Build, inspect and verify a TensorRT engine for every zoo model and exporter, then run the GPU tests.
#
# Runs in the docker/ image (TensorRT >= 11 and a GPU), from the repository root:
#   docker run --gpus all -v $PWD/engines:/workspace/trtattn/engines trtattn docker/build_engines.sh [MODEL ...]
#
# For each model (all of `trtattn zoo list --json`, or the MODELs given) and each exporter it supports:
#   1. trtattn zoo export MODEL --exporter X -o out/build_engines/MODEL_X.onnx
#   2. trtattn build MODEL_X.onnx --name MODEL_X --force  -> engines/MODEL_X.engine + engines/MODEL_X.json
#   3. trtattn inspect engines/MODEL_X.engine --sites engines/MODEL_X.json --require-fused
#   4. trtattn verify engines/MODEL_X.engine --onnx MODEL_X.onnx
# A failed step skips the later steps of that model only; every model is tried. Then `pytest -m trt`.
# Prints one row per model and exporter, and exits 1 if anything failed.
#
# Environment: WORK_DIR (ONNX files and logs, default out/build_engines), EXPORTERS (default: every
# exporter a model supports), SKIP_TESTS=1 (no pytest -m trt).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
ENGINES_DIR=engines  # the mounted folder: NAME.engine and NAME.json go there
WORK_DIR=${WORK_DIR:-out/build_engines}
LOG_DIR="$WORK_DIR/logs"
mkdir -p "$ENGINES_DIR" "$LOG_DIR"

if ! listing=$(trtattn zoo list --json 2>"$LOG_DIR/zoo-list.log"); then
    echo "build_engines: 'trtattn zoo list --json' failed:" >&2
    tail -n 20 "$LOG_DIR/zoo-list.log" >&2
    exit 2
fi
# "model exporter" pairs, restricted to the MODELs and EXPORTERS asked for
pairs=$(python3 -c '
import json, os, sys
want = set(sys.argv[1:])
exporters = set(os.environ.get("EXPORTERS", "").split())
rows = json.loads(sys.stdin.read())
unknown = want - {r["name"] for r in rows}
if unknown:
    sys.exit("build_engines: not in the zoo: " + ", ".join(sorted(unknown)))
for r in rows:
    if want and r["name"] not in want:
        continue
    for x in r["exporters"]:
        if not exporters or x in exporters:
            print(r["name"], x)
' "$@" <<<"$listing")
if [[ -z "$pairs" ]]; then
    echo "build_engines: nothing to build" >&2
    exit 2
fi

STEPS=(export build inspect verify)
declare -a rows=()
failures=0

# run_step LOG COMMAND...: appends the command and its output to LOG; its exit code is the command's
run_step() {
    local log=$1
    shift
    printf '\n$ %s\n' "$*" >>"$log"
    "$@" >>"$log" 2>&1 </dev/null  # never the loop's stdin (the list of models)
}

while read -r model exporter; do
    name="${model}_${exporter}"
    onnx="$WORK_DIR/$name.onnx"
    engine="$ENGINES_DIR/$name.engine"
    sidecar="$ENGINES_DIR/$name.json"
    log="$LOG_DIR/$name.log"
    : >"$log"
    declare -A status=()
    for s in "${STEPS[@]}"; do status[$s]="-"; done
    echo "== $name"
    failed=""
    for s in "${STEPS[@]}"; do
        case $s in
            export) cmd=(trtattn zoo export "$model" --exporter "$exporter" -o "$onnx" --force) ;;
            build) cmd=(trtattn build "$onnx" --name "$name" --out-dir "$ENGINES_DIR" --force) ;;
            inspect) cmd=(trtattn inspect "$engine" --sites "$sidecar" --require-fused) ;;
            verify) cmd=(trtattn verify "$engine" --onnx "$onnx") ;;
        esac
        if run_step "$log" "${cmd[@]}"; then
            status[$s]=ok
        else
            status[$s]=FAIL
            failed=$s
            break
        fi
    done
    if [[ -n "$failed" ]]; then
        failures=$((failures + 1))
        result="FAIL ($failed)"
        echo "   $failed failed; last lines of $log:"
        tail -n 15 "$log" | sed 's/^/   | /'
    else
        result=ok
        # the per-site verdict of inspect, for the record
        grep -E '^[0-9]+ attention site' "$log" | tail -n 1 | sed 's/^/   /' || true
    fi
    rows+=("$(printf '%-28s %-12s %-7s %-7s %-7s %-7s %s' "$model" "$exporter" \
        "${status[export]}" "${status[build]}" "${status[inspect]}" "${status[verify]}" "$result")")
    unset status
done <<<"$pairs"

tests="skipped (SKIP_TESTS=1)"
if [[ "${SKIP_TESTS:-0}" != 1 ]]; then
    echo "== pytest -m trt"
    set +e
    python3 -m pytest -m trt -q -rs -p no:cacheprovider >"$LOG_DIR/pytest-trt.log" 2>&1
    code=$?
    set -e
    tail -n 20 "$LOG_DIR/pytest-trt.log" | sed 's/^/   | /'
    summary=$(grep -E '^(=+ )?[0-9]+ (passed|failed|skipped|error|deselected)' "$LOG_DIR/pytest-trt.log" | tail -n 1 || true)
    summary=$(echo "${summary//=/}" | xargs)
    if [[ $code -eq 0 && $summary == *passed* ]]; then
        tests="ok ($summary)"
    elif [[ $code -eq 0 ]]; then
        tests="FAIL: every trt test skipped, none ran ($summary); is the GPU visible (docker run --gpus all)?"
        failures=$((failures + 1))
    elif [[ $code -eq 5 ]]; then
        tests="FAIL: no trt test collected"
        failures=$((failures + 1))
    else
        tests="FAIL (pytest exit $code: $summary)"
        failures=$((failures + 1))
    fi
fi

echo
echo "== summary (logs in $LOG_DIR)"
printf '%-28s %-12s %-7s %-7s %-7s %-7s %s\n' model exporter export build inspect verify result
for row in "${rows[@]}"; do echo "$row"; done
echo "pytest -m trt: $tests"
if ((failures > 0)); then
    echo "$failures failure(s)"
    exit 1
fi
echo "all engines built, fused and verified"
