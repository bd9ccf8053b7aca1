#!/usr/bin/env bash
# The GPU memory paths on a real GPU host, with its CUDA driver instead of
# the test double that `make test` uses (engine/device/fakecuda).
#
#   bash scripts/gpu-check.sh build    # here: build the binaries into .gpu/
#   bash scripts/gpu-check.sh run [py] [bench] [go]   # on the GPU host (default: all three)
#
# `build` needs Go (and gcc for the C library); `run` needs only what a GPU
# host has: the NVIDIA driver, and a python3 with torch for the Python part
# (skipped without it). Logs go to $OUT (default /tmp/gpu-check). Runs:
#   1. the device tests of the Go packages against libcuda.so.1 (tests that
#      arm the double's failures or count its calls cannot run on a real
#      driver and are skipped by name);
#   2. python/tests/test_gpu_torch.py: torch CUDA tensors through the engine,
#      across processes (CUDA IPC and TCP), the store, and the vLLM
#      connector's save fence;
#   3. `mooncake bench te --use_vram` against host memory, same run.
set -uo pipefail
cd "$(dirname "$0")/.."
D=.gpu
# package dir -> the tests that touch GPU memory (tests of the double's
# hooks, and of a second GPU on a host with one, skip themselves)
declare -A RUN=(
    [engine/device]=''
    [engine/transport/cudaipc]=''
    [engine/transport/stage]=''
    [engine]='Device|CudaIPC|RegisterWithoutDriver'
    [store/client]='GPU'
    [bench/te]='VRAM'
)

build() {
    mkdir -p $D
    go build -trimpath -ldflags='-s -w' -o $D/mooncake ./cmd/mooncake || exit 1
    bash scripts/build-capi.sh >/dev/null || exit 1
    cp -L build/libmooncake.so build/libmooncake_go.so $D/
    for p in "${!RUN[@]}"; do
        go test -c -trimpath -ldflags='-s -w' -o "$D/$(echo "$p" | tr / _).test" "./$p" || exit 1
    done
    du -sh $D
}

run() {
    local out=${OUT:-/tmp/gpu-check} fail=0 parts=${*:-py bench go}
    mkdir -p "$out"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    export MC_CUDA_DRIVER=libcuda.so.1
    for part in $parts; do
        run_$part || fail=1
    done
    return $fail
}

run_go() {
    local out=${OUT:-/tmp/gpu-check} fail=0
    echo "== Go device tests on the real driver"
    for p in "${!RUN[@]}"; do
        local bin log
        bin=$PWD/$D/$(echo "$p" | tr / _).test
        log=$out/go_$(echo "$p" | tr / _).log
        (cd "$p" && "$bin" -test.v -test.count=1 -test.timeout=180s \
            ${RUN[$p]:+-test.run="${RUN[$p]}"}) >"$log" 2>&1
        local rc=$?
        echo "$p: rc=$rc $(grep -c '^--- PASS' "$log") passed, $(grep -c '^--- FAIL' "$log") failed, $(grep -c '^--- SKIP' "$log") skipped"
        if [ $rc -ne 0 ]; then
            fail=1
            grep -E -B2 -A12 '^--- FAIL|panic:' "$log" | head -60
        fi
    done
    return $fail
}

run_py() {
    local out=${OUT:-/tmp/gpu-check} fail=0
    echo "== Python: torch CUDA tensors"
    if python3 -c 'import torch, sys; sys.exit(not torch.cuda.is_available())' 2>/dev/null; then
        PYTHONPATH=$PWD/python/src:$PWD/python/tests MOONCAKE_GO_LIBRARY=$PWD/$D/libmooncake.so \
            MOONCAKE_BIN=$PWD/$D/mooncake PYTHONUNBUFFERED=1 \
            python3 -m pytest -p no:cacheprovider -v -s -rs python/tests/test_gpu_torch.py 2>&1 |
            tee "$out/py.log" | grep -E 'PASS|FAIL|SKIP|ERROR|Error|assert|passed|failed|returned before' | head -80
        [ "${PIPESTATUS[0]}" -eq 0 ] || fail=1
    else
        echo "python3 has no torch with CUDA: skipped"
    fi
    return $fail
}

run_bench() {
    local out=${OUT:-/tmp/gpu-check} fail=0
    echo "== bench te, 4 MiB requests: GPU memory (--use_vram) and host memory, same run; GB/s, median of 3"
    local tr op mem
    for op in write read; do
        for cfg in ${BENCH_CFGS:-"tcp vram" "tcp host" "shm vram" "shm host"}; do
            read -r tr mem <<<"$cfg"
            local j flags=
            [ "$mem" = vram ] && flags="--use_vram --gpu_id 0"
            j=$($D/mooncake bench te --transport "$tr" --op $op --block-size 4MiB \
                --duration 1s --repeat 3 --json $flags 2>>"$out/bench.err")
            echo "$j" >>"$out/bench.jsonl"
            python3 -c 'import json,sys,types; j=json.loads(sys.argv[1], object_hook=lambda d: types.SimpleNamespace(**d)); print(f"{sys.argv[2]:3} {sys.argv[3]:5} {sys.argv[4]:4}: ours {j.gb_per_s:6.2f} GB/s p50 {j.p50_us:6.0f} us | {j.yardstick_name} {j.yardstick_gb_per_s:.2f} | {j.ratio:.2f}")' \
                "$j" "$tr" "$op" "$mem" || { echo "$tr $op $mem: bench failed"; tail -5 "$out/bench.err"; fail=1; }
        done
    done
    return $fail
}

case "${1:-}" in
build) build ;;
run) shift; run "$@" ;;
*) echo "usage: $0 build|run" >&2; exit 2 ;;
esac
