#!/usr/bin/env bash
# build.sh OUTDIR: builds the CUDA driver test double as OUTDIR/libfakecuda.so.
# Point MC_CUDA_DRIVER at it to run the engine's device path without a GPU.
set -euo pipefail
if [ $# -ne 1 ]; then
    echo "usage: $0 OUTDIR" >&2
    exit 2
fi
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$1"
# -fvisibility=hidden: only the driver's entry points and the fakecuda_*
# hooks are exported (EXPORT in fakecuda.c).
${CC:-gcc} -shared -fPIC -O2 -Wall -Wextra -Werror -fvisibility=hidden -pthread \
    -o "$1/libfakecuda.so" "$here/fakecuda.c"
