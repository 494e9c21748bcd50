#!/usr/bin/env bash
# Here (not on the device): download SGLang 0.5.17 and the packages it needs that the GPU image
# lacks, bundle them and cut the bundle into parts small enough to carry one per device call.
# The GPU image has torch 2.11.0+cu130 (what SGLang 0.5.17 pins) and transformers 5.17:
# torch, triton, the nvidia-* CUDA wheels and the Hugging Face stack are dropped from the
# bundle so the image's own are used (pip then runs --no-deps on the device).
# Result: .sglang-wheels/part-00 ... part-NN (44 MiB each, git-ignored). Run from the root.
# Untested end to end so far: if pip cannot resolve a wheel-only set for cp312 manylinux
# x86_64, it says which package has no wheel; add its wheel by hand or drop the extra.
set -euo pipefail
dest=.sglang-wheels
grep -qx "/$dest/" .git/info/exclude 2>/dev/null || echo "/$dest/" >> .git/info/exclude
rm -rf "$dest" && mkdir -p "$dest/bundle"
plat=(--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64
      --platform manylinux2014_x86_64 --platform manylinux_2_31_x86_64 --platform any)
python3 -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp \
  "${plat[@]}" -d "$dest/bundle" "sglang==0.5.17"
# What the image already has (same versions or the ones our stack runs with).
( cd "$dest/bundle" && rm -f torch-* triton-* nvidia_* transformers-* tokenizers-* \
    safetensors-* huggingface_hub-* hf_xet-* numpy-* peft-* accelerate-* httpx-* httpcore-* \
    psutil-* rich-* typer-* jinja2-* MarkupSafe-* nvidia_ml_py-* )
du -sh "$dest/bundle"; ls "$dest/bundle" | sed 's/-[0-9].*//' | sort | tr '\n' ' '; echo
tar cf - -C "$dest" bundle | split -b 44M -d -a 2 - "$dest/part-"
rm -rf "$dest/bundle"
ls -la "$dest"
