#!/usr/bin/env bash
# The wheel bench/tasks.py needs on the GPU machine that its image lacks: diffusers (pure
# Python, 6.1 MiB), for Stable Diffusion 1.5's UNet and VAE (the CLIP text encoder is
# transformers', which is there). Its other needs are there already (huggingface_hub 1.33,
# safetensors 0.8, numpy, Pillow, regex, requests, filelock; importlib_metadata only below
# Python 3.8). Downloaded for CPython 3.12 into .whl/ (git-ignored; carry it with .deps);
# bench/tasks.sh installs it with pip --no-index --no-deps into /tmp/site.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .whl
DIFFUSERS=${KILN_DIFFUSERS_VERSION:-0.42.1}
if ! ls .whl/diffusers-"$DIFFUSERS"-*.whl >/dev/null 2>&1; then
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 -d .whl "diffusers==$DIFFUSERS"
fi
ls -la .whl/diffusers-*.whl
du -sh .whl
