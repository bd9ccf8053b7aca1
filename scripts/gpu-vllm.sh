#!/usr/bin/env bash
# Real vLLM on a GPU, with our connector (connectors/vllm): the suite
# e2e/vllm/test_mooncake_go_connector.py with the model on CUDA, on a GPU
# host that reaches no package index. Everything it lacks travels in parts
# under .gpuvllm/, each small enough for one copy of the working tree
# (about 50 MiB), and is unpacked there into $SITE (default /tmp/vllm-site).
#
#   bash scripts/gpu-vllm.sh pack            # here: .gpuvllm/1 .. .gpuvllm/3
#   bash scripts/gpu-vllm.sh unpack N        # there, once part N arrived
#   bash scripts/gpu-vllm.sh run [pytest args...]   # there, all parts unpacked
#
# The host needs the NVIDIA driver and a python3 (3.12) with torch 2.11 for
# CUDA 13: vllm==0.26.0 is the last vLLM release built against torch 2.11,
# and its kernels for CUDA 13. e2e/vllm/gpu.lock lists what such an image
# lacks. The parts:
#   1: vLLM's main kernel library, xz-compressed (78 MB, 53 MiB packed);
#   2: the wheels of e2e/vllm/gpu.lock;
#   3: vLLM's Python sources and FlashAttention 3 kernels (the FA2 and MoE
#      kernels and the Rust frontend stay behind: a Hopper GPU runs FA3, the
#      tiny Llama has no experts), and our wheel (scripts/build-wheel.sh).
# Logs go to $OUT (default /tmp/gpu-vllm).
set -uo pipefail
cd "$(dirname "$0")/.."
P=.gpuvllm
VLLM=0.26.0
SITE=${SITE:-/tmp/vllm-site}
PLAT=(--only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64
      --platform manylinux_2_27_x86_64 --platform manylinux_2_26_x86_64 --platform manylinux_2_24_x86_64
      --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_5_x86_64
      --platform manylinux1_x86_64 --platform manylinux_2_31_x86_64)

pack() {
    local tmp
    tmp=$(mktemp -d)
    rm -rf $P && mkdir -p $P/1 $P/2 $P/3 || exit 1
    python3 -m pip download -q --no-deps "${PLAT[@]}" -d "$tmp" vllm==$VLLM || exit 1
    python3 -m pip download -q --no-deps "${PLAT[@]}" -d $P/2 -r e2e/vllm/gpu.lock || exit 1
    (cd "$tmp" && unzip -q vllm-$VLLM-*.whl && rm vllm-$VLLM-*.whl) || exit 1
    rm -f "$tmp"/vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so "$tmp"/vllm/vllm-rs "$tmp"/vllm/_moe_C_stable_libtorch.abi3.so
    xz -T0 -9 -c "$tmp"/vllm/_C_stable_libtorch.abi3.so >$P/1/_C_stable_libtorch.abi3.so.xz || exit 1
    rm "$tmp"/vllm/_C_stable_libtorch.abi3.so
    (cd "$tmp" && tar -cf - vllm vllm-$VLLM.dist-info) | xz -T0 -9 >$P/3/vllm.tar.xz || exit 1
    rm -rf "$tmp"
    cp "$(bash scripts/build-wheel.sh)" $P/3/ || exit 1
    du -sh $P/*
}

unpack() {
    local n=$1
    mkdir -p "$SITE"
    case $n in
    1) xz -dc $P/1/_C_stable_libtorch.abi3.so.xz >"$SITE/_C_stable_libtorch.abi3.so.part" ;;
    2) python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" $P/2/*.whl ;;
    3) xz -dc $P/3/vllm.tar.xz | tar -xf - -C "$SITE" &&
        mv "$SITE/_C_stable_libtorch.abi3.so.part" "$SITE/vllm/_C_stable_libtorch.abi3.so" &&
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" $P/3/mooncake_go-*.whl ;;
    *) echo "unpack: no part $n" >&2; return 2 ;;
    esac
}

run() {
    local out=${OUT:-/tmp/gpu-vllm} tmp=/tmp/gpu-vllm-tmp
    mkdir -p "$out"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    # vLLM 0.26 seeds its block hashes at random in each process unless
    # PYTHONHASHSEED is set (later releases seed sha256 with a fixed
    # string): without it, no instance finds another's blocks in the store.
    # FlashInfer stays behind (its sampler is optional; vLLM imports it to
    # ask unless told not to use it).
    export PYTHONPATH=$SITE PYTHONUNBUFFERED=1 PYTHONHASHSEED=0 VLLM_USE_FLASHINFER_SAMPLER=0
    export MOONCAKE_BIN=$SITE/mooncake_go/bin/mooncake
    # The CPU's block size (the suite counts 128-token blocks), and several
    # engines on one GPU.
    export MOONCAKE_E2E_VLLM_ENGINE_ARGS=${MOONCAKE_E2E_VLLM_ENGINE_ARGS:-'{"block_size": 128, "gpu_memory_utilization": 0.05}'}
    python3 -c 'import torch, vllm; import vllm._C_stable_libtorch; print("torch", torch.__version__, "vllm", vllm.__version__, torch.cuda.get_device_name())' || return 1
    (cd e2e && python3 -m pytest -p no:cacheprovider -c pytest.ini -v -rs --basetemp=$tmp \
        vllm/test_mooncake_go_connector.py "$@") 2>&1 | tee "$out/pytest.log"
    local rc=${PIPESTATUS[0]}
    # The engines' logs, for a failure's reading.
    (cd $tmp && tar -czf "$out/vllm-logs.tgz" $(find . -name '*.log')) 2>/dev/null
    return "$rc"
}

case "${1:-}" in
pack) pack ;;
unpack) shift; unpack "$@" ;;
run) shift; run "$@" ;;
*) echo "usage: $0 pack|unpack N|run" >&2; exit 2 ;;
esac
