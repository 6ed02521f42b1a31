#!/usr/bin/env bash
# Eval gate for CI or an operator: evaluate a candidate model against a baseline on the
# regression suites and keep the reports. Run from the repository root:
#
#   CANDIDATE=qwen-7b-next deploy/ci/eval-gate.sh
#   CANDIDATE=chat-default BASELINE_MODELS_FILE=/tmp/models.main.yaml deploy/ci/eval-gate.sh
#   CANDIDATE=vllm MODELS_FILE=config/models.vllm.yaml VLLM_BASE_URL=http://gpu:8000/v1 deploy/ci/eval-gate.sh
#
# What it does: `make install` (unless INSTALL=0); for each run, starts the local llama.cpp
# backends the models file launches (`switchyard backend start ID`; a backend that already
# answers is left alone) and stops what it started when the run is done or the script exits;
# `switchyard eval run` per suite for the baseline (unless BASELINE_RUN gives its run file)
# and the candidate; `switchyard eval gate` per suite. Switchyard never starts vLLM: point a
# vLLM models file at a running server (its ${VLLM_BASE_URL}).
#
# Environment (all optional but CANDIDATE):
#   CANDIDATE             alias or backend id to evaluate (required). A backend id is
#                         evaluated alone, without the alias's fallbacks.
#   BASELINE              alias or backend id to compare with (default: chat-default).
#   BASELINE_RUN          reuse stored baseline run files instead of running BASELINE: a run
#                         file (with one suite) or a directory holding <suite>.json.
#   SUITES                space-separated suites: names of eval/datasets/<name>, suite
#                         directories, or dataset .jsonl files (default: "rag agent chat").
#   MODELS_FILE           model registry for the runs (default: the settings', normally
#                         config/models.yaml); sets SWITCHYARD_GATEWAY__MODELS_FILE.
#   BASELINE_MODELS_FILE  model registry for the baseline's runs (default: MODELS_FILE); e.g.
#                         the target branch's models.yaml, to gate a change of an alias.
#   THRESHOLDS            thresholds file for the gate (default: eval/thresholds.yaml).
#   JUDGE                 alias that judges faithfulness, relevancy and correctness (sets
#                         SWITCHYARD_EVAL__JUDGE; default: the settings', normally none).
#   OUT_DIR               where the reports go (default: eval-reports): per suite
#                         <suite>/{baseline,candidate}.{json,html} and
#                         <suite>/gate.{json,md,html}; summary.md for all suites.
#   DATA_DIR              Switchyard's data directory (sets SWITCHYARD_DATA_DIR).
#   START_BACKENDS        1 (default): start the local backends each models file launches
#                         once per side, for all its suites; 0: leave it to `eval run`,
#                         which starts and stops the local backends it needs per suite.
#   INSTALL               1 (default): run `make install` first; 0: use the existing .venv.
#   SWITCHYARD            the CLI (default: .venv/bin/switchyard).
#   DRY_RUN               1: print the commands instead of running them (no install either).
# Anything else Switchyard reads (SWITCHYARD_CONFIG, SWITCHYARD_*, VLLM_BASE_URL,
# VLLM_API_KEY) passes through.
#
# Exit status, as `switchyard eval gate`: 0 every suite passed; 1 a suite regressed;
# 2 could not evaluate (bad settings, a failed install, backend or run, or a gate that could
# not evaluate). A regression wins over "could not evaluate".

set -euo pipefail

readonly PASS=0 REGRESSION=1 NOT_EVALUATED=2

log() { printf 'eval-gate: %s\n' "$*" >&2; }
die() {
    log "error: $*"
    exit "$NOT_EVALUATED"
}

usage() { sed -n '2,/^$/{s/^# \{0,1\}//;p}' "$0"; }

case "${1:-}" in
    -h | --help)
        usage
        exit 0
        ;;
    "") ;;
    *) die "unexpected argument '$1': settings come from the environment (see --help)" ;;
esac

# --- settings, checked before anything is installed or started ----------------------------

[ -f pyproject.toml ] && [ -d eval ] && [ -f Makefile ] ||
    die "run from the Switchyard repository root (no pyproject.toml, eval/ and Makefile in $(pwd))"

CANDIDATE="${CANDIDATE:-}"
[ -n "$CANDIDATE" ] || die "CANDIDATE is not set: the alias or backend id to evaluate (e.g. CANDIDATE=qwen-7b-next)"
BASELINE="${BASELINE:-chat-default}"
BASELINE_RUN="${BASELINE_RUN:-}"
SUITES="${SUITES:-rag agent chat}"
MODELS_FILE="${MODELS_FILE:-}"
BASELINE_MODELS_FILE="${BASELINE_MODELS_FILE:-$MODELS_FILE}"
THRESHOLDS="${THRESHOLDS:-}"
JUDGE="${JUDGE:-}"
OUT_DIR="${OUT_DIR:-eval-reports}"
START_BACKENDS="${START_BACKENDS:-1}"
INSTALL="${INSTALL:-1}"
SWITCHYARD="${SWITCHYARD:-.venv/bin/switchyard}"
DRY_RUN="${DRY_RUN:-0}"
DATA_DIR="${DATA_DIR:-}"

read -r -a suites <<<"$SUITES"
[ "${#suites[@]}" -gt 0 ] || die "SUITES is empty: name at least one suite (e.g. SUITES=rag)"
for flag in START_BACKENDS INSTALL DRY_RUN; do
    case "${!flag}" in 0 | 1) ;; *) die "$flag must be 0 or 1, not '${!flag}'" ;; esac
done
for file_var in MODELS_FILE BASELINE_MODELS_FILE THRESHOLDS; do
    if [ -n "${!file_var}" ] && [ ! -f "${!file_var}" ]; then
        die "$file_var=${!file_var}: no such file"
    fi
done
if [ -n "$BASELINE_RUN" ]; then
    if [ -d "$BASELINE_RUN" ]; then
        :
    elif [ -f "$BASELINE_RUN" ]; then
        [ "${#suites[@]}" -eq 1 ] ||
            die "BASELINE_RUN=$BASELINE_RUN is one run file but SUITES has ${#suites[@]} suites: give a directory of <suite>.json, or one suite"
    else
        die "BASELINE_RUN=$BASELINE_RUN: no such file or directory"
    fi
fi

# A suite's short name: its reports' directory and, in a BASELINE_RUN directory, <name>.json.
suite_name() {
    local name="${1##*/}"
    name="${name%.jsonl}"
    printf '%s' "${name//[^A-Za-z0-9._-]/_}"
}

baseline_file_for() { # the stored baseline run of a suite, or nothing
    if [ -z "$BASELINE_RUN" ]; then
        return 0
    elif [ -f "$BASELINE_RUN" ]; then
        printf '%s' "$BASELINE_RUN"
    else
        printf '%s' "$BASELINE_RUN/$(suite_name "$1").json"
    fi
}

if [ -d "$BASELINE_RUN" ]; then
    for suite in "${suites[@]}"; do
        stored="$(baseline_file_for "$suite")"
        [ -f "$stored" ] || die "BASELINE_RUN=$BASELINE_RUN has no $(suite_name "$suite").json for suite '$suite'"
    done
fi

if [ -n "$DATA_DIR" ]; then export SWITCHYARD_DATA_DIR="$DATA_DIR"; fi
if [ -n "$JUDGE" ]; then export SWITCHYARD_EVAL__JUDGE="$JUDGE"; fi

# --- running ----------------------------------------------------------------------------

run() { # a command, or its echo in a dry run
    if [ "$DRY_RUN" = 1 ]; then
        printf '+ %s\n' "$*" >&2
    else
        "$@"
    fi
}

# Local backends this script started and will stop. Each side's runs start and stop their
# own (the baseline's and the candidate's models files may launch them differently), so
# these are always the current models file's.
started=()

stop_backends() {
    local id
    for id in ${started[@]+"${started[@]}"}; do
        log "stopping backend $id"
        run "$SWITCHYARD" backend stop "$id" >&2 || log "could not stop backend $id"
    done
    started=()
}

# Stop what was started, whatever happens, and keep the exit status.
on_exit() {
    local status=$?
    trap - EXIT
    stop_backends
    exit "$status"
}
trap on_exit EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# The llama.cpp backends the current models file launches (an id per line); none for a
# vLLM file.
managed_backends() {
    local python="${SWITCHYARD%/*}/python"
    if [ "$DRY_RUN" = 1 ] && [ ! -x "$python" ]; then
        echo "local"
        return 0
    fi
    "$python" - <<'PY'
from gateway.registry import LocalLaunch, load_registry
from serving.settings import load_settings

for backend in load_registry(load_settings().gateway.models_file).backends.values():
    if isinstance(backend.launch, LocalLaunch):
        print(backend.id)
PY
}

start_backends() {
    local id ids
    [ "$START_BACKENDS" = 1 ] || return 0
    ids="$(managed_backends)" || return 1
    for id in $ids; do
        if [ "$DRY_RUN" = 0 ] && "$SWITCHYARD" backend status "$id" >/dev/null 2>&1; then
            log "backend $id already answers: using it (and leaving it running)"
            continue
        fi
        log "starting backend $id"
        started+=("$id")
        run "$SWITCHYARD" backend start "$id" >&2 || return 1
    done
}

# One side's runs: every suite against MODEL with MODELS (empty: the settings' file).
# Writes <suite>/<role>.json and .html; a run that fails before writing leaves no file (the
# suite is then not gated: could not evaluate). Run files are written atomically.
evaluate() {
    local role="$1" model="$2" models="$3" suite dir target
    local -a input
    if [ -n "$models" ]; then
        export SWITCHYARD_GATEWAY__MODELS_FILE="$models"
    else
        unset SWITCHYARD_GATEWAY__MODELS_FILE
    fi
    if ! start_backends; then
        log "could not start the local backends for the $role"
        stop_backends
        return 1
    fi
    for suite in "${suites[@]}"; do
        dir="$OUT_DIR/$(suite_name "$suite")"
        target="$dir/$role.json"
        if [ -f "$suite" ]; then input=(--dataset "$suite"); else input=("$suite"); fi
        rm -f "$target" # never gate a previous job's file
        log "$role: eval run ${input[*]} --model $model"
        if ! run "$SWITCHYARD" eval run "${input[@]}" --model "$model" --json "$target" --html "$dir/$role.html"; then
            log "$role: the run of suite '$suite' on $model exited non-zero"
        fi
    done
    stop_backends
}

mkdir -p "$OUT_DIR"
for suite in "${suites[@]}"; do
    mkdir -p "$OUT_DIR/$(suite_name "$suite")"
done

if [ "$INSTALL" = 1 ]; then
    log "make install"
    run make install >&2 || die "make install failed"
fi
[ "$DRY_RUN" = 1 ] || [ -x "$SWITCHYARD" ] || die "$SWITCHYARD is missing: run make install (or set SWITCHYARD)"

saved_models_file="${SWITCHYARD_GATEWAY__MODELS_FILE:-}"
if [ -n "$BASELINE_RUN" ]; then
    for suite in "${suites[@]}"; do
        stored="$(baseline_file_for "$suite")"
        copy="$OUT_DIR/$(suite_name "$suite")/baseline.json"
        [ "$stored" -ef "$copy" ] || run cp "$stored" "$copy"
    done
else
    evaluate baseline "$BASELINE" "${BASELINE_MODELS_FILE:-$saved_models_file}" ||
        die "the baseline could not be evaluated"
fi
evaluate candidate "$CANDIDATE" "${MODELS_FILE:-$saved_models_file}" || die "the candidate could not be evaluated"

# --- gating -------------------------------------------------------------------------------

overall=$PASS
summary="$OUT_DIR/summary.md"
{
    echo "# Eval gate: \`$CANDIDATE\` against \`${BASELINE_RUN:-$BASELINE}\`"
    echo
} >"$summary.tmp"
for suite in "${suites[@]}"; do
    name="$(suite_name "$suite")"
    dir="$OUT_DIR/$name"
    echo "## Suite \`$name\`" >>"$summary.tmp"
    echo >>"$summary.tmp"
    gate_args=(--baseline "$dir/baseline.json" --candidate "$dir/candidate.json")
    [ -n "$THRESHOLDS" ] && gate_args+=(--thresholds "$THRESHOLDS")
    gate_args+=(--json "$dir/gate.json" --markdown "$dir/gate.md" --html "$dir/gate.html")
    if [ "$DRY_RUN" = 0 ] && { [ ! -f "$dir/baseline.json" ] || [ ! -f "$dir/candidate.json" ]; }; then
        code=$NOT_EVALUATED
        log "$name: not gated: a run file is missing (its run failed)"
        echo "**COULD NOT EVALUATE**: the baseline's or the candidate's run failed (see the job's log)." >>"$summary.tmp"
    else
        log "$name: eval gate"
        set +e
        run "$SWITCHYARD" eval gate "${gate_args[@]}" >&2
        code=$?
        set -e
        case "$code" in
            "$PASS" | "$REGRESSION" | "$NOT_EVALUATED") ;;
            *)
                log "$name: the gate exited $code; counted as could not evaluate"
                code=$NOT_EVALUATED
                ;;
        esac
        if [ -f "$dir/gate.md" ]; then
            cat "$dir/gate.md" >>"$summary.tmp"
        else
            echo "**COULD NOT EVALUATE** (exit $code): the gate wrote no report (see the job's log)." >>"$summary.tmp"
        fi
    fi
    echo >>"$summary.tmp"
    if [ "$code" = "$REGRESSION" ]; then
        overall=$REGRESSION
    elif [ "$code" = "$NOT_EVALUATED" ] && [ "$overall" = "$PASS" ]; then
        overall=$NOT_EVALUATED
    fi
done
mv "$summary.tmp" "$summary"
log "reports in $OUT_DIR (summary: $summary); exit $overall"
exit "$overall"
