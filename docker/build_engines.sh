#!/usr/bin/env bash
# Build, inspect and verify a TensorRT engine for every zoo model and exporter, then run the GPU tests.
#
# Runs in the docker/ image (TensorRT >= 11 and a GPU), from the repository root:
#   docker run --gpus all -v $PWD/engines:/workspace/trtattn/engines trtattn docker/build_engines.sh [MODEL ...]
#
# For each model (all of `trtattn zoo list --json`, or the MODELs given) and each exporter it supports:
#   1. trtattn zoo export MODEL --exporter X -o out/build_engines/MODEL_X.onnx
#   2. trtattn build MODEL_X.onnx --name MODEL_X --precision fp16 --force  -> engines/MODEL_X.engine + .json
#      (the whole model in fp16, never --decomposable: a site without a fused kernel fails the build)
#   3. trtattn inspect engines/MODEL_X.engine --sites engines/MODEL_X.json --require-fused
#   4. trtattn verify engines/MODEL_X.engine --onnx MODEL_X.onnx
# Then the trtexec route (route 2, see trtexec_route below) for the same models:
#   1. trtattn fuse MODEL_X.onnx -o MODEL_X.trt.onnx --ops trt  -> TensorRT's own ONNX ops, verified on CPU,
#      and MODEL_X.trt.json (the engine's sidecar with the trtexec shapes)
#   2. trtexec --onnx=MODEL_X.trt.onnx --stronglyTyped --profilingVerbosity=detailed --exportLayerInfo=...
#      with the sidecar's --minShapes/--optShapes/--maxShapes -> engines/MODEL_X.trtexec.engine
#   3. trtattn inspect engines/MODEL_X.trtexec.layers.json --sites MODEL_X.trt.json --require-fused
#   4. trtattn verify engines/MODEL_X.trtexec.engine --onnx MODEL_X.onnx --sidecar MODEL_X.trt.json
# A failed step skips the later steps of that model only; every model is tried. Then `pytest -m trt`.
# Prints one row per model and exporter and route, and exits 1 if anything failed.
#
# Environment: WORK_DIR (ONNX files and logs, default out/build_engines), EXPORTERS (default: every
# exporter a model supports), SKIP_TESTS=1 (no pytest -m trt), TRTEXEC_ROUTE=0 (no trtexec route),
# TRTEXEC (the trtexec binary; default: on PATH or in the image's TensorRT folders), TRT_FORM (the form
# the trtexec route writes: padded (default), packed or kv-cache).
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
            build) cmd=(trtattn build "$onnx" --name "$name" --out-dir "$ENGINES_DIR" --precision fp16 --force) ;;
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

# ---------------------------------------------------------------- route 2: trtexec on TensorRT's own ONNX ops
TRT_STEPS=(fuse trtexec inspect verify)
declare -a trtexec_rows=()

find_trtexec() {
    local candidate
    for candidate in "${TRTEXEC:-}" "$(command -v trtexec || true)" /usr/src/tensorrt/bin/trtexec \
        /opt/tensorrt/bin/trtexec /workspace/tensorrt/bin/trtexec; do
        if [[ -n "$candidate" && -x "$candidate" ]]; then
            echo "$candidate"
            return 0
        fi
    done
    return 1
}

# trtexec_route MODEL EXPORTER: fuse --ops trt, trtexec with the sidecar's shapes, inspect, verify; one row
trtexec_route() {
    local model=$1 exporter=$2
    local name="${model}_${exporter}"
    local onnx="$WORK_DIR/$name.onnx" ops="$WORK_DIR/$name.trt.onnx" sidecar="$WORK_DIR/$name.trt.json"
    local engine="$ENGINES_DIR/$name.trtexec.engine" layers="$ENGINES_DIR/$name.trtexec.layers.json"
    local log="$LOG_DIR/$name.trtexec.log" failed="" s
    local -a cmd shape_flags
    local -A status=()
    : >"$log"
    for s in "${TRT_STEPS[@]}"; do status[$s]="-"; done
    echo "== $name (trtexec route)"
    if [[ ! -f "$onnx" ]] && ! run_step "$log" trtattn zoo export "$model" --exporter "$exporter" -o "$onnx" --force; then
        failed=export
    fi
    for s in "${TRT_STEPS[@]}"; do
        [[ -n "$failed" ]] && break
        case $s in
            fuse) cmd=(trtattn fuse "$onnx" -o "$ops" --ops trt --form "${TRT_FORM:-padded}" --force) ;;
            trtexec)
                # the sidecar's shapes: one --minShapes/--optShapes/--maxShapes triple per profile
                mapfile -t shape_flags < <(python3 -c 'import json, sys
for profile in json.load(open(sys.argv[1]))["trtexec"]["shapes"]:
    for flag, value in profile.items():
        print(f"{flag}={value}")' "$sidecar")
                cmd=("$TRTEXEC_BIN" --onnx="$ops" --stronglyTyped --profilingVerbosity=detailed --saveEngine="$engine"
                     --exportLayerInfo="$layers" --skipInference "${shape_flags[@]}") ;;
            inspect) cmd=(trtattn inspect "$layers" --sites "$sidecar" --require-fused) ;;
            verify) cmd=(trtattn verify "$engine" --onnx "$onnx" --sidecar "$sidecar") ;;
        esac
        if run_step "$log" "${cmd[@]}"; then
            status[$s]=ok
        else
            status[$s]=FAIL
            failed=$s
        fi
    done
    local result=ok
    if [[ -n "$failed" ]]; then
        failures=$((failures + 1))
        result="FAIL ($failed)"
        echo "   $failed failed; last lines of $log:"
        tail -n 15 "$log" | sed 's/^/   | /'
    fi
    trtexec_rows+=("$(printf '%-28s %-12s %-7s %-7s %-7s %-7s %s' "$model" "$exporter" \
        "${status[fuse]}" "${status[trtexec]}" "${status[inspect]}" "${status[verify]}" "$result")")
}

if [[ "${TRTEXEC_ROUTE:-1}" != 0 ]]; then
    if ! TRTEXEC_BIN=$(find_trtexec); then
        echo "build_engines: no trtexec (set TRTEXEC=/path/to/trtexec, or TRTEXEC_ROUTE=0 to skip the route)" >&2
        trtexec_rows+=("trtexec not found: route not run")
        failures=$((failures + 1))
    else
        while read -r model exporter; do
            trtexec_route "$model" "$exporter"
        done <<<"$pairs"
    fi
fi

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
if ((${#trtexec_rows[@]})); then
    echo
    echo "trtexec route (fuse --ops trt, form ${TRT_FORM:-padded}):"
    printf '%-28s %-12s %-7s %-7s %-7s %-7s %s\n' model exporter fuse trtexec inspect verify result
    for row in "${trtexec_rows[@]}"; do echo "$row"; done
fi
echo "pytest -m trt: $tests"
if ((failures > 0)); then
    echo "$failures failure(s)"
    exit 1
fi
echo "all engines built, fused and verified"
