#!/usr/bin/env bash
# Packs what the `flashinfer*` backends need (flashinfer-python and the packages its ragged prefill imports)
# as cp312 x86-64 wheels for an offline GPU runner: Python 3.12 with a CUDA 13 torch (and torch's own
# dependencies: jinja2, filelock, typing_extensions), numpy, and nvcc in the image. Uploads are limited to
# 64 MiB each, the checkout included, so the ~80 MB of wheels travel in two parts of < 48 MB:
#
#   tools/flashinfer-bundle.sh [DEST]          # DEST defaults to .fi-bundle (keep it git-ignored)
#
# Then, on the runner (each part in its own upload; the working copy may be replaced in between):
#   bash DEST/part1/stash.sh                   # upload 1: keeps part1 in /opt/flashinfer-parts
#   bash DEST/part2/install.sh                 # upload 2: joins the parts, installs into /opt/flashinfer (idempotent)
#   export PYTHONPATH=/opt/flashinfer:$PYTHONPATH PATH=/opt/flashinfer/bin:$PATH
#   export FLASHINFER_WORKSPACE_BASE=/opt/flashinfer-jit   # compiled kernels land in /opt, kept between calls
#   python3 -c "import flashinfer; print(flashinfer.__version__)"
# /opt lasts as long as the runner does; a fresh runner needs both uploads again. FI_OPT=<dir> on the runner
# puts parts, install and nothing else under <dir> instead of /opt.
#
# What travels and why:
#   flashinfer-python       the library and the CUDA sources its JIT compiles at first use of each (backend,
#                           dtype, head dims) configuration, with nvcc and ninja: minutes each. Its prebuilt
#                           modules (flashinfer-jit-cache) are published only on flashinfer.ai's own index, and
#                           flashinfer-cubin holds trtllm-gen cubins the sm_90 prefill does not use.
#   apache-tvm-ffi          the loader of the JIT-built modules
#   ninja                   the build tool the JIT runs (its wheel puts `ninja` in /opt/flashinfer/bin)
#   nvidia-ml-py            pynvml, imported by `import flashinfer`
#   nvidia-cudnn-frontend   the `cudnn` module of the flashinfer-cudnn backend
#   requests, urllib3, idna, certifi, charset-normalizer, tqdm, packaging
#                           imported by `import flashinfer`; installed only where the runner lacks them
# flashinfer-python's other requirements (nvidia-cutlass-dsl, cuda-tile, nccl4py, nccl-extensions, cuda-python,
# click, tabulate, einops) serve other kernels and are not imported by the ragged prefill: left out (--no-deps).
set -euo pipefail
dest=${1:-.fi-bundle}
FI=${FLASHINFER_VERSION:-0.7.2.post1}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
plat=(--only-binary=:all: --python-version 3.12 --implementation cp
      --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64
      --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_5_x86_64
      --platform manylinux1_x86_64)
# version ranges: flashinfer-python 0.7.2.post1's Requires-Dist
required=("flashinfer-python==$FI" "apache-tvm-ffi>=0.1.11,<0.2" "ninja" "nvidia-ml-py" "nvidia-cudnn-frontend>=1.31.0")
# module:distribution pairs installed only when the runner cannot import the module already
optional=(requests:requests urllib3:urllib3 idna:idna certifi:certifi charset_normalizer:charset-normalizer
          tqdm:tqdm packaging:packaging)
python3 -m pip download -q --no-deps "${plat[@]}" -d "$tmp" "${required[@]}" "${optional[@]#*:}" 2>&1 \
  | grep -v "is ignored" || true

rm -rf "$dest/part1" "$dest/part2"
mkdir -p "$dest/part1" "$dest/part2"
big=$(ls "$tmp"/flashinfer_python-*.whl)
name=$(basename "$big")
sum=$(sha256sum "$big" | cut -d' ' -f1)
# flashinfer-python (62 MB) is cut in two; every other wheel rides in part2
split -b 46000000 -d "$big" "$tmp/chunk."
[ ! -e "$tmp/chunk.02" ] || { echo "$name no longer splits in two parts; raise the chunk size" >&2; exit 1; }
mv "$tmp/chunk.00" "$dest/part1/$name.00"
mv "$tmp/chunk.01" "$dest/part2/$name.01"
rm "$big"
mv "$tmp"/*.whl "$dest/part2/"
for pair in "${optional[@]}"; do
  module=${pair%%:*} dist=${pair#*:}
  wheel=$(cd "$dest/part2" && ls "${dist//-/_}"-*.whl)
  echo "$module $wheel"
done > "$dest/part2/optional.txt"

cat > "$dest/part1/stash.sh" <<STASH
#!/usr/bin/env bash
set -euo pipefail
opt=\${FI_OPT:-/opt}
mkdir -p "\$opt/flashinfer-parts"
cp "\$(cd "\$(dirname "\$0")" && pwd)/$name.00" "\$opt/flashinfer-parts/"
echo "part1 kept in \$opt/flashinfer-parts"
STASH

cat > "$dest/part2/install.sh" <<INSTALL
#!/usr/bin/env bash
# Joins the split flashinfer-python wheel, checks it, and installs the bundle into \$FI_OPT/flashinfer
# (/opt/flashinfer) in one pip call; optional.txt lists wheels installed only when their module is missing.
set -euo pipefail
here=\$(cd "\$(dirname "\$0")" && pwd)
opt=\${FI_OPT:-/opt}
target=\$opt/flashinfer
if PYTHONPATH=\$target python3 -c "import flashinfer" 2>/dev/null; then
  echo "flashinfer already installed in \$target"; exit 0
fi
first=\$opt/flashinfer-parts/$name.00
[ -f "\$first" ] || first=\$here/../part1/$name.00
[ -f "\$first" ] || { echo "part1 missing: run part1/stash.sh in an earlier upload" >&2; exit 1; }
work=\$(mktemp -d)
trap 'rm -rf "\$work"' EXIT
cat "\$first" "\$here/$name.01" > "\$work/$name"
echo "$sum  \$work/$name" | sha256sum -c --quiet - \\
  || { echo "the two parts come from different bundles: build both with one run of the bundle script" >&2; exit 1; }
wheels=("\$work/$name")
while read -r module wheel; do
  if python3 -c "import \$module" 2>/dev/null; then echo "kept the runner's \$module"; else wheels+=("\$here/\$wheel"); fi
done < "\$here/optional.txt"
for wheel in "\$here"/*.whl; do
  grep -q " \$(basename "\$wheel")\$" "\$here/optional.txt" || wheels+=("\$wheel")
done
python3 -m pip install -q --no-index --no-deps --no-compile --target "\$target" "\${wheels[@]}"
echo "flashinfer installed in \$target; export PYTHONPATH=\$target:\\\$PYTHONPATH PATH=\$target/bin:\\\$PATH"
INSTALL
chmod +x "$dest/part1/stash.sh" "$dest/part2/install.sh"
du -b "$dest/part1" "$dest/part2"
ls -l "$dest/part1" "$dest/part2"
