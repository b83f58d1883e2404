#!/usr/bin/env bash
# Wheels for the Hugging Face drop-in on the GPU machine (scripts/hf_step_time.py, the
# "hf" step of scripts/gpu-validate.sh), which has no network: run this where pip can
# download. It puts transformers (issue 26 names 5.23) in .hf-wheels/ (git-ignored), and
# of its needs only those the image lacks. The image (Python 3.12, torch 2.11) has
# transformers 5.17.0 with huggingface_hub 1.33.0, safetensors 0.8.0 and tokenizers 0.23.2
# (KINDS.md's pip list), and so the rest that 5.17 requires (numpy, packaging, pyyaml,
# regex>=2025.10.22, tqdm, typer): 5.23's requirements are the same but for
# huggingface-hub>=1.31,<3, which 1.33.0 meets. So by default only transformers travels
# (about 13 MiB; with .whl/, about 18 MiB, well inside the 64 MiB a device call carries).
# A requirement that the image's listed version does not meet, or a name not listed, is
# fetched too and named. Carry ".whl" and ".hf-wheels" (Liger comes from .whl/).
set -euo pipefail
cd "$(dirname "$0")/.."
TRANSFORMERS=${TRANSFORMERS_VERSION:-5.23.0}
DL=/tmp/hf-wheels
rm -rf .hf-wheels "$DL" && mkdir -p .hf-wheels "$DL"
platforms=()
for p in manylinux1 manylinux2014 manylinux_2_17 manylinux_2_24 manylinux_2_27 \
         manylinux_2_28 manylinux_2_31 manylinux_2_34 manylinux_2_35; do
  platforms+=(--platform "${p}_x86_64")
done
fetch() {
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp "${platforms[@]}" -d "$DL" "$@"
}
fetch "transformers==$TRANSFORMERS"
# transformers' own requirements (extras left out) against the image's versions: a name
# with a version must meet the specifier, a name with "" is there (5.17 needs it too)
missing=$(unzip -p "$DL"/transformers-*.whl '*/METADATA' | python3 -c '
import sys
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
image = {"huggingface-hub": "1.33.0", "safetensors": "0.8.0", "tokenizers": "0.23.2",
         "numpy": "2.5.2", "packaging": "", "pyyaml": "", "regex": "", "tqdm": "",
         "typer": ""}
for line in sys.stdin:
    if not line.startswith("Requires-Dist:"):
        continue
    req = Requirement(line.split(":", 1)[1].strip())
    if req.marker and "extra" in str(req.marker):
        continue
    have = image.get(canonicalize_name(req.name))
    if have is None or (have and not req.specifier.contains(have, prereleases=True)):
        print(f"{req.name}{req.specifier}")
')
for req in $missing; do
  echo "not met on the image, fetched: $req"
  fetch "$req"
done
mv "$DL"/*.whl .hf-wheels/
rm -rf "$DL"
ls -l .hf-wheels
du -sh .hf-wheels
[[ ! -d .whl ]] || du -shc .whl .hf-wheels | tail -1
