#!/usr/bin/env bash
# Here (not on the device): download SGLang 0.5.17 and the packages it needs, bundle them and
# cut the bundle into parts small enough to carry one per device call. Run from the root.
# benchmarks/sglang_wheels.txt pins the set: SGLang 0.5.17's dependencies resolved for
# cp312 manylinux_2_39 x86_64 (the GPU image: Python 3.12.3, glibc 2.39), leaving out what
# the image has (torch 2.11.0+cu130, which SGLang 0.5.17 pins, torchvision, triton, the
# Hugging Face stack, numpy, httpx...), plus SGLang's own transformers==5.12.1 and a
# tokenizers it accepts: SGLang 0.5.17 registers a `qwen3_asr` config that the image's
# transformers 5.17 already has, so it does not import with the image's transformers.
# Regenerate the pins with uv (resolving torch's own pins fails: nvidia-nccl-cu13==2.28.9
# is not on PyPI any more, hence the exclusions):
#   uv pip compile <(echo sglang==0.5.17) --excludes EXCLUDES --python-version 3.12 \
#     --python-platform x86_64-manylinux_2_39 --only-binary :all: --format pylock.toml
# Result: .sglang-wheels/part-00 ... (44 MiB each, git-ignored): 174 wheels, 1.31 GB,
# 30 parts (sglang-kernel alone is 365 MiB).
set -euo pipefail
dest=.sglang-wheels
grep -qx "/$dest/" .git/info/exclude 2>/dev/null || echo "/$dest/" >> .git/info/exclude
rm -rf "$dest" && mkdir -p "$dest/bundle"
plat=()  # SGLang 0.5.17 itself is a manylinux_2_34 wheel
for tag in 2_39 2_35 2_34 2_31 2_28 2_27 2_24 2_17 2_12 2_5; do
  plat+=(--platform "manylinux_${tag}_x86_64")
done
plat+=(--platform manylinux2014_x86_64 --platform manylinux2010_x86_64
       --platform manylinux1_x86_64 --platform any)
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp "${plat[@]}" -d "$dest/bundle" -r benchmarks/sglang_wheels.txt
echo "$(ls "$dest/bundle" | wc -l) wheels, $(du -sh "$dest/bundle" | cut -f1)"
tar cf - -C "$dest" bundle | split -b 44M -d -a 2 - "$dest/part-"
rm -rf "$dest/bundle"
ls -la "$dest"
