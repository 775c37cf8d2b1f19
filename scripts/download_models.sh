#!/usr/bin/env bash
# Downloads stories260K (llama2.c checkpoint + its 512-token tokenizer, MIT, Andrej Karpathy)
# into ./models, for machines that do not have ../shared/models. Needs internet access.
set -euo pipefail
dest=${1:-models}
base=https://huggingface.co/karpathy/tinyllamas/resolve/main/stories260K
mkdir -p "$dest"
for f in stories260K.bin tok512.bin; do
  if [[ ! -s "$dest/$f" ]]; then
    echo "downloading $f"
    curl -fsSL --retry 3 -o "$dest/$f.part" "$base/$f"
    mv "$dest/$f.part" "$dest/$f"
  fi
done
echo "stories260K is in $dest"
