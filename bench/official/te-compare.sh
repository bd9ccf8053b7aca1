#!/usr/bin/env bash
# te-compare.sh: the official Mooncake Transfer Engine as a yardstick for
# ours. For each operation and block size it runs the official
# transfer_engine_bench (target + initiator, TCP on loopback, descriptors in
# our HTTP metadata server) and `mooncake bench te` with the same workload,
# interleaved, --repeat times each, and prints the medians and ours/official.
# See README.md in this directory.
set -euo pipefail

usage() {
  cat <<'EOF'
usage: bench/official/te-compare.sh [flags]
  --ours PATH         our binary (default: bin/mooncake; build it with `make build`)
  --venv PATH         venv holding mooncake-transfer-engine-non-cuda (default: .venv-official; `make deps`)
  --ops LIST          comma-separated: write,read (default: write,read)
  --block-sizes LIST  comma-separated sizes: 131072, 128KiB, 1MiB, 4M ... (default: 128KiB,1MiB,4MiB)
  --batch-size N      requests per batch (default: 64)
  --threads N         submitting threads (default: 2)
  --duration SECONDS  whole seconds per run (default: 5)
  --repeat N          runs of each engine per point, interleaved (default: 3)
  --official-only     skip our engine
  --keep-logs DIR     keep every log in DIR (default: a temporary directory, removed)
EOF
}

root=$(cd "$(dirname "$0")/../.." && pwd)
ours=$root/bin/mooncake
venv=$root/.venv-official
ops=write,read
blocks=128KiB,1MiB,4MiB
batch=64
threads=2
duration=5
repeat=3
official_only=0
keep=""
while (($#)); do
  case $1 in
    --ours) ours=$2; shift 2 ;;
    --venv) venv=$2; shift 2 ;;
    --ops) ops=$2; shift 2 ;;
    --block-sizes) blocks=$2; shift 2 ;;
    --batch-size) batch=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --duration) duration=$2; shift 2 ;;
    --repeat) repeat=$2; shift 2 ;;
    --official-only) official_only=1; shift ;;
    --keep-logs) keep=$2; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "te-compare: unknown flag $1" >&2; usage >&2; exit 2 ;;
  esac
done

die() { echo "te-compare: $*" >&2; exit 1; }
log() { echo "te-compare: $*" >&2; }

[[ $duration =~ ^[1-9][0-9]*$ ]] || die "--duration takes whole seconds (transfer_engine_bench's unit), got $duration"
for v in batch threads repeat; do [[ ${!v} =~ ^[1-9][0-9]*$ ]] || die "--${v/batch/batch-size} must be a positive integer"; done
[ -x "$ours" ] || die "$ours not found: run \`make build\` (or pass --ours)"
py=$venv/bin/python
[ -x "$py" ] || die "$py not found: run \`make deps\` (or pass --venv)"
# Run the bench binary itself: the console script wraps it in a subprocess,
# and killing the wrapper would orphan the benchmark.
pkgdir=$("$py" -c 'import os, mooncake; print(os.path.dirname(mooncake.__file__))') \
  || die "cannot import mooncake from $py"
official=$pkgdir/transfer_engine_bench
[ -x "$official" ] || die "$official not found in the wheel"

# to_bytes 128KiB -> 131072 (K/M/G and KiB/MiB/GiB are powers of 1024, KB/MB/GB of 1000).
to_bytes() {
  local s=$1 n u
  [[ $s =~ ^([0-9]+)([A-Za-z]*)$ ]] || die "bad size $s"
  n=${BASH_REMATCH[1]}; u=${BASH_REMATCH[2]}
  case $u in
    ""|B) echo "$n" ;;
    K|KiB|k) echo $((n << 10)) ;;
    M|MiB) echo $((n << 20)) ;;
    G|GiB) echo $((n << 30)) ;;
    KB) echo $((n * 1000)) ;;
    MB) echo $((n * 1000000)) ;;
    GB) echo $((n * 1000000000)) ;;
    *) die "bad size unit in $s" ;;
  esac
}

# Check the workload before starting anything. The official target's
# buffer must hold the largest one: threads * batch * block.
max_block=0
IFS=, read -ra block_list <<<"$blocks"
IFS=, read -ra op_list <<<"$ops"
for b in "${block_list[@]}"; do
  v=$(to_bytes "$b") || exit 1
  ((v > max_block)) && max_block=$v
done
for op in "${op_list[@]}"; do [[ $op == read || $op == write ]] || die "--ops: $op is not read or write"; done
buffer=$((threads * batch * max_block))
((buffer >= 64 << 20)) || buffer=$((64 << 20))

if [ -n "$keep" ]; then
  mkdir -p "$keep"; work=$(cd "$keep" && pwd)
else
  work=$(mktemp -d -t te-compare.XXXXXX)
fi

# Every process we start is recorded here and stopped by pid on exit,
# whatever the exit: TERM first, KILL after 5 s.
pids=()
# alive PID: running, not merely exited and waiting to be reaped.
alive() { [ -r "/proc/$1/status" ] && ! grep -q '^State:[[:space:]]*Z' "/proc/$1/status"; }
cleanup() {
  local rc=$? i p
  trap - EXIT INT TERM
  # Newest first, so the metadata server outlives the engines' goodbyes.
  for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
    p=${pids[i]}
    kill -TERM "$p" 2>/dev/null || continue
    for _ in $(seq 50); do alive "$p" || break; sleep 0.1; done
    kill -KILL "$p" 2>/dev/null || true
    wait "$p" 2>/dev/null || true
  done
  [ -z "$keep" ] && rm -rf "$work"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# wait_for SECONDS CMD...: poll CMD until it succeeds.
wait_for() {
  local limit=$1; shift
  local end=$((SECONDS + limit))
  until "$@"; do
    ((SECONDS < end)) || return 1
    sleep 0.1
  done
}

# The same environment for every official process: TCP only, on loopback.
export MC_FORCE_TCP=1 MC_TCP_BIND_ADDRESS=127.0.0.1

# 1. Our HTTP metadata server; it prints its URL on its first stdout line.
"$ours" metadata --host 127.0.0.1 --port 0 >"$work/metadata.out" 2>"$work/metadata.err" &
pids+=($!)
wait_for 10 grep -q '^http://' "$work/metadata.out" || die "metadata server did not start: $(cat "$work/metadata.err")"
meta=$(grep -m1 '^http://' "$work/metadata.out")
log "metadata server $meta"

# 2. One official target whose buffer holds the largest workload.
target=127.0.0.1:12345
"$official" --mode=target --protocol=tcp --metadata_server="$meta" \
  --local_server_name="$target" --buffer_size="$buffer" >"$work/target.out" 2>"$work/target.err" &
pids+=($!)
target_pid=$!
key=$("$py" -c 'import sys, urllib.parse; print(urllib.parse.quote(sys.argv[1], safe=""))' "mooncake/ram/$target")
# Ready once its descriptor lists the buffer.
target_ready() {
  kill -0 "$target_pid" 2>/dev/null || die "official target exited: $(tail -5 "$work/target.err")"
  curl -sf "$meta?key=$key" 2>/dev/null | grep -q '"buffers":\[{'
}
wait_for 30 target_ready || die "official target did not publish its buffer: $(tail -5 "$work/target.err")"
log "official target $target, buffer $buffer bytes"

# forget PID: it has been reaped; never signal a recycled pid.
forget() {
  local p keep=()
  for p in "${pids[@]}"; do [ "$p" = "$1" ] || keep+=("$p"); done
  pids=("${keep[@]}")
}

# The runners below set $result (GB/s). They run in this shell, not in a
# $(...) subshell, so that their pids are known to cleanup.

# run_official OP BYTES RUN
run_official() {
  local op=$1 bytes=$2 run=$3 name out pid rc
  name=127.0.0.1:$((13000 + run)) # a fresh segment name per run
  out=$work/official-$op-$bytes-$run.err
  timeout --kill-after=5 $((duration + 60)) "$official" --mode=initiator --protocol=tcp \
    --metadata_server="$meta" --local_server_name="$name" --segment_id="$target" \
    --operation="$op" --block_size="$bytes" --batch_size="$batch" --threads="$threads" \
    --duration="$duration" --buffer_size="$buffer" --report_unit=GB --report_precision=4 \
    >"$out" 2>&1 &
  pid=$!; pids+=($pid)
  rc=0; wait "$pid" || rc=$?
  forget "$pid"
  ((rc == 0)) || die "official initiator failed (exit $rc): $(tail -5 "$out")"
  # e.g. "Test completed: duration 5.01, batch count 400, throughput 5.2312 GB/s"
  result=$(sed -nE 's/.*Test completed:.*throughput ([0-9.]+) GB\/s.*/\1/p' "$out" | tail -1)
  [ -n "$result" ] || die "no throughput line in the official initiator's output: $(tail -5 "$out")"
}

# Our bench's yardstick would double its run time; skip it where supported.
ours_flags=()
"$ours" bench te --help 2>/dev/null | grep -q -- '--no-yardstick' && ours_flags+=(--no-yardstick)

# run_ours OP BYTES RUN
run_ours() {
  local op=$1 bytes=$2 run=$3 out pid rc
  out=$work/ours-$op-$bytes-$run.json
  timeout --kill-after=5 $((duration + 60)) "$ours" bench te --transport tcp --op "$op" \
    --block-size "$bytes" --batch-size "$batch" --threads "$threads" --duration "${duration}s" \
    --repeat 1 --json "${ours_flags[@]}" >"$out" 2>"$work/ours-$op-$bytes-$run.err" &
  pid=$!; pids+=($pid)
  rc=0; wait "$pid" || rc=$?
  forget "$pid"
  ((rc == 0)) || die "mooncake bench te failed (exit $rc): $(tail -5 "$work/ours-$op-$bytes-$run.err")"
  result=$("$py" -c 'import json, sys; print(json.load(open(sys.argv[1]))["gb_per_s"])' "$out") \
    || die "no gb_per_s in $out"
}

median() { printf '%s\n' "$@" | sort -g | awk '{v[NR]=$1} END {if (NR%2) print v[(NR+1)/2]; else print (v[NR/2]+v[NR/2+1])/2}'; }

rejected() { grep -c 'not within any registered buffer' "$work/target.err" || true; }

results=()
run=0
for op in "${op_list[@]}"; do
  for b in "${block_list[@]}"; do
    bytes=$(to_bytes "$b") || exit 1
    off=(); mine=()
    for r in $(seq "$repeat"); do
      run=$((run + 1))
      run_official "$op" "$bytes" "$run"
      off+=("$result")
      log "$op $b run $r: official ${off[-1]} GB/s"
      if ((!official_only)); then
        run_ours "$op" "$bytes" "$run"
        mine+=("$result")
        log "$op $b run $r: ours $(printf '%.4f' "${mine[-1]}") GB/s"
      fi
    done
    n=$(rejected)
    ((n == 0)) || die "the official target rejected $n requests: its buffer is too small"
    mo=$(median "${off[@]}")
    if ((official_only)); then
      results+=("$op $b $mo - -")
    else
      mm=$(median "${mine[@]}")
      results+=("$op $b $mo $(printf '%.3f' "$mm") $(awk -v a="$mm" -v b="$mo" 'BEGIN {printf "%.2f", (b > 0 ? a / b : 0)}')")
    fi
  done
done

echo
echo "TCP loopback, batch $batch, threads $threads, ${duration}s runs, medians of $repeat (GB/s = 1e9 bytes/s); $(nproc) CPUs"
printf '%-6s %-8s %14s %10s %14s\n' op block "official GB/s" "ours GB/s" "ours/official"
for row in "${results[@]}"; do
  # shellcheck disable=SC2086
  printf '%-6s %-8s %14.3f %10s %14s\n' $row
done
[ -n "$keep" ] && log "logs in $work"
exit 0
