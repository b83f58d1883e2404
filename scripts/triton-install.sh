#!/usr/bin/env bash
# Triton 3.7.1 onto the GPU machine, from the parts scripts/triton-wheels.sh made. One device
# call per part, in a row, each while the machine is still warm (it keeps /tmp only while warm):
#
#   carry [".triton-wheels/1"]:   bash scripts/triton-install.sh
#   carry [".triton-wheels/2"]:   bash scripts/triton-install.sh
#   ...
#   carry [".triton-wheels/N"]:   bash scripts/triton-install.sh && export PYTHONPATH=/tmp/triton371:$PYTHONPATH && ...
#
# (N as scripts/triton-wheels.sh printed; the order does not matter, the folder holding
# triton.sha256 just has to come along once.) Each call adds its part to /tmp/triton-stage and,
# until all parts are there, says what is staged and exits 0. Once all are, it joins them, checks
# the sha256 and installs the wheel into /tmp/triton371, beside the machine's own Triton (3.6.0,
# torch 2.11's); a later call sees it installed and does nothing more. Then
#   export PYTHONPATH=/tmp/triton371:$PYTHONPATH
# makes `import triton` give the new one.
set -euo pipefail
cd "$(dirname "$0")/.."
STAGE=/tmp/triton-stage
TARGET=${TRITON_TARGET:-/tmp/triton371}
PYTHON=${PYTHON:-python3}
mkdir -p "$STAGE"
shopt -s nullglob
for dir in .triton-wheels/*/; do
    for f in "$dir"*; do cp "$f" "$STAGE"/; done
done
cd "$STAGE"

usage() {
    echo "use it with:  export PYTHONPATH=$TARGET\${PYTHONPATH:+:\$PYTHONPATH}"
    echo "  then \`python3 -c 'import triton; print(triton.__version__)'\` prints $1"
}

if [ ! -f parts.txt ]; then
    echo "nothing staged yet: carry a .triton-wheels/<i> folder (made by scripts/triton-wheels.sh)"
    ls -la "$STAGE"
    exit 0
fi
WHEEL=$(awk '$1 == "wheel" {print $2}' parts.txt)
COUNT=$(awk '$1 == "count" {print $2}' parts.txt)
mapfile -t PARTS < <(awk '$1 == "part" {print $2}' parts.txt)
VERSION=$(echo "$WHEEL" | cut -d- -f2)
if [ "${#PARTS[@]}" -ne "$COUNT" ]; then
    echo "parts.txt lists ${#PARTS[@]} parts but says $COUNT" >&2; exit 1
fi

if [ -f installed ] && [ "$(cat installed)" = "$WHEEL" ] && [ -f "$TARGET/triton/__init__.py" ]; then
    echo "$WHEEL is already installed in $TARGET"
    usage "$VERSION"
    exit 0
fi

missing=()
have=0
for p in "${PARTS[@]}"; do
    if [ -f "$p" ]; then have=$((have + 1)); else missing+=("$p"); fi
done
[ -f triton.sha256 ] || missing+=(triton.sha256)
if [ "${#missing[@]}" -gt 0 ]; then
    echo "staged so far for $WHEEL ($have of $COUNT parts):"
    ls -la "$STAGE"
    echo "still missing: ${missing[*]}"
    exit 0
fi

cat "${PARTS[@]}" > "$WHEEL"
sha256sum -c triton.sha256
rm -rf "$TARGET"
"$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$TARGET" "$WHEEL"
rm -f "$WHEEL"
echo "$WHEEL" > installed
echo "Triton $VERSION installed into $TARGET"
usage "$VERSION"
