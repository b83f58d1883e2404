#!/usr/bin/env bash
# Wheels for the GPU machine, which has no network (run this where pip can download).
#
# The GPU machine's image (Python 3.12, torch 2.11, triton 3.6) lacks what the suite's
# Jupyter-bound modules and the chapters need (nbformat, nbclient, nbval, ipykernel,
# ipywidgets and their dependencies; docutils, which test_ledger uses to name a page's
# places as the book does) and Liger-Kernel, the benchmarks' peer. This puts
# them in .whl/ (git-ignored, ~13 MiB), which scripts/gpu-validate.sh installs into
# /tmp/site: name ".whl" in the device call's carry. Packages the image already has
# (pytest, packaging, psutil, pygments, ...) are left out, so the image's versions stay.
set -euo pipefail
cd "$(dirname "$0")/.."
LIGER=${LIGER_VERSION:-0.8.5}
DL=/tmp/device-wheels
rm -rf .whl "$DL" && mkdir -p .whl "$DL"
platforms=()
for p in manylinux1 manylinux2014 manylinux_2_17 manylinux_2_24 manylinux_2_27 \
         manylinux_2_28 manylinux_2_31 manylinux_2_34 manylinux_2_35; do
  platforms+=(--platform "${p}_x86_64")
done
fetch() {
  python3 -m pip download -q --only-binary=:all: --python-version 3.12 \
    --implementation cp "${platforms[@]}" -d "$DL" "$@"
}
# The Jupyter stack at the versions the CPU run uses (the venv .ci/run makes from
# requirements.txt), so both machines execute the chapters with the same nbclient and nbval;
# without a .venv, requirements.txt's own pins and ranges.
pinned() {
  local v
  if v=$(.venv/bin/python -c "import importlib.metadata as m; print(m.version('$1'))" 2>/dev/null)
  then echo "$1==$v"
  else v=$(grep -E "^$1([=<>~ ]|$)" requirements.txt | sed 's/ *#.*//'); echo "${v:-$1}"
  fi
}
fetch $(for p in nbformat nbclient nbval ipykernel ipywidgets docutils; do pinned $p; done)
fetch --no-deps "liger-kernel==$LIGER"
# pytest-xdist, for the tests step's JOBS=N: on the H200 on 2026-12-02 the suite alone
# reached 68 % in about 430 s (the call's limit cut it), and took 137 s with JOBS=8
fetch --no-deps pytest-xdist==3.8.0 execnet==2.1.2
# on the image already (KINDS.md's package list): keep its versions
on_image=(attrs coverage iniconfig packaging pluggy psutil pygments pytest python_dateutil
          typing_extensions six)
for name in "${on_image[@]}"; do rm -f "$DL/$name"-[0-9]*.whl; done
mv "$DL"/*.whl .whl/
rm -rf "$DL"
ls .whl && du -sh .whl
