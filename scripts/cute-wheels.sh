#!/usr/bin/env bash
# CuTeDSL for the GPU machine, which has no network (run this where pip can download).
#
# The GPU machine runs Python 3.12 and a CUDA 13 driver, so it needs nvidia-cutlass-dsl with its
# cu13 libraries, and their own dependencies. One device call carries at most 64 MiB, the working
# tree (~11 MiB) included, and the cu13 libraries' wheel alone is ~88 MiB: it travels split in
# three parts, one per call, with its sha256.
#
#   .cute-wheels/1/   part 'aa' of the cu13 libraries, CuTeDSL's other wheels, TVM-FFI (carry in call 1)
#   .cute-wheels/2/   part 'ab', cuda-bindings                                    (carry in call 2)
#   .cute-wheels/3/   part 'ac', the wheel's sha256                      (carry in call 3, with .whl)
#
# On the GPU machine, scripts/cute-install.sh puts them together (see there).
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=${CUTE_DSL_VERSION:-4.8.1}
rm -rf .cute-wheels /tmp/cute-dl && mkdir -p .cute-wheels/1 .cute-wheels/2 .cute-wheels/3 /tmp/cute-dl
pip download -q --only-binary=:all: --python-version 3.12 --platform manylinux_2_28_x86_64 --no-deps \
    -d /tmp/cute-dl "nvidia-cutlass-dsl==$VERSION" "nvidia-cutlass-dsl-libs-base==$VERSION" \
    "nvidia-cutlass-dsl-libs-core==$VERSION" "nvidia-cutlass-dsl-libs-cu13==$VERSION" \
    "cuda-bindings>=13,<14" cuda-pathfinder protobuf apache-tvm-ffi
LIBS=$(ls /tmp/cute-dl/nvidia_cutlass_dsl_libs_cu13-"$VERSION"-*.whl)
(cd /tmp/cute-dl && sha256sum "$(basename "$LIBS")") > .cute-wheels/3/libs.sha256
split -b 30M "$LIBS" /tmp/cute-dl/libs.part.
rm "$LIBS"
mv /tmp/cute-dl/libs.part.aa .cute-wheels/1/
mv /tmp/cute-dl/libs.part.ab /tmp/cute-dl/cuda_bindings-*.whl .cute-wheels/2/
mv /tmp/cute-dl/libs.part.ac .cute-wheels/3/
mv /tmp/cute-dl/*.whl .cute-wheels/1/
du -sh .cute-wheels/*
