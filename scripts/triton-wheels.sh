#!/usr/bin/env bash
# Triton for the GPU machine, which has no network (run this where pip can download).
#
# The GPU machine runs Python 3.12 with torch 2.11 and its Triton 3.6.0; this fetches a newer
# Triton (3.7.1 unless TRITON_VERSION says otherwise) to use beside it. One device call carries at
# most 64 MiB, the working tree (~11 MiB) included, and the wheel is ~189 MiB: it travels split in
# parts of at most 48 MiB, one part per call, each in its own folder:
#
#   .triton-wheels/1/   triton.part.00, parts.txt                          (carry in call 1)
#   .triton-wheels/2/   triton.part.01, parts.txt                          (carry in call 2)
#   ...
#   .triton-wheels/N/   the last part, parts.txt, triton.sha256            (carry in call N)
#
# parts.txt (in every folder) names the wheel, the number of parts and each part; triton.sha256
# is the whole wheel's. On the GPU machine, scripts/triton-install.sh puts them together (see there).
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=${TRITON_VERSION:-3.7.1}
OUT=.triton-wheels
DL=/tmp/triton-dl
rm -rf "$OUT" "$DL" && mkdir -p "$OUT" "$DL"
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_27_x86_64 --platform manylinux_2_28_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d "$DL" "triton==$VERSION"
shopt -s nullglob
WHEELS=("$DL"/triton-"$VERSION"-*.whl)
if [ "${#WHEELS[@]}" -ne 1 ]; then
    echo "expected one triton $VERSION wheel in $DL, found ${#WHEELS[@]}" >&2; exit 1
fi
WHEEL=${WHEELS[0]}
NAME=$(basename "$WHEEL")
(cd "$DL" && sha256sum "$NAME") > "$DL/triton.sha256"
split -b 48M -d -a 2 "$WHEEL" "$DL/triton.part."
rm "$WHEEL"
PARTS=("$DL"/triton.part.*)
N=${#PARTS[@]}
{
    echo "wheel $NAME"
    echo "count $N"
    for p in "${PARTS[@]}"; do echo "part $(basename "$p")"; done
} > "$DL/parts.txt"
i=0
for p in "${PARTS[@]}"; do
    i=$((i + 1))
    mkdir -p "$OUT/$i"
    mv "$p" "$OUT/$i/"
    cp "$DL/parts.txt" "$OUT/$i/"
done
mv "$DL/triton.sha256" "$OUT/$N/"
rm -rf "$DL"
echo "$NAME in $N parts:"
du -sh "$OUT"/*
