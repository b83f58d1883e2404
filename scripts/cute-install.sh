#!/usr/bin/env bash
# CuTeDSL onto the GPU machine, from the three parts scripts/cute-wheels.sh made. Three device
# calls in a row, each while the machine is still warm (it keeps /tmp only while warm):
#
#   carry [".cute-wheels/1"]:          bash scripts/cute-install.sh
#   carry [".cute-wheels/2"]:          bash scripts/cute-install.sh
#   carry [".cute-wheels/3", ".whl"]:  bash scripts/cute-install.sh && ...
#
# Each call adds its part to /tmp/cute-stage. Once all parts are there, it joins them, checks the
# sha256 and installs everything into /tmp/site; then
#   export PYTHONPATH=/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages:$PWD
# (pip --target does not run the .pth file that puts CuTeDSL's packages on the path).
set -euo pipefail
cd "$(dirname "$0")/.."
STAGE=/tmp/cute-stage
mkdir -p "$STAGE"
for part in .cute-wheels/*/; do cp "$part"* "$STAGE"/; done
cd "$STAGE"
if [ ! -f libs.sha256 ] || [ ! -f libs.part.aa ] || [ ! -f libs.part.ab ] || [ ! -f libs.part.ac ]; then
    echo "staged so far:"; ls "$STAGE"; exit 0
fi
LIBS=$(cut -d' ' -f3 libs.sha256)
cat libs.part.aa libs.part.ab libs.part.ac > "$LIBS"
sha256sum -c libs.sha256
WHEELS=$(ls ./*.whl)
if python3 -c "import cuda.bindings.driver" 2>/dev/null; then   # keep the machine's own, if any
    WHEELS=$(ls ./*.whl | grep -v -e cuda_bindings -e cuda_pathfinder)
fi
# shellcheck disable=SC2086
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site $WHEELS
echo "CuTeDSL installed into /tmp/site"
