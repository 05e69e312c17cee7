#!/usr/bin/env bash
# The GPU check on a lent device machine (issue 28): run there, in the repository root, after the parts
# of scripts/device_bundle.py have been moved to STAGING by the calls it prints.
#
#   bash scripts/device_check.sh STAGING PARTS [--device cuda|cpu]
#
# Joins and unpacks the bundle, installs its wheels (the server's dependencies the image lacks, and
# onnxruntime-gpu) into a venv over the image's Python, then runs scripts/gpu_check.py on every fixture
# kind and `python -m bench gpu` on MiniLM, each with a time limit, and leaves their output, nvidia-smi's
# and pip's in $OUT (the device tool brings $OUT back). --device cpu runs the same on the CPU (how the
# test suite keeps this script working without a GPU).
set -euo pipefail

staging=${1:?usage: device_check.sh STAGING PARTS [--device cuda|cpu]}
parts=${2:?usage: device_check.sh STAGING PARTS [--device cuda|cpu]}
device=cuda
[[ "${3:-}" == "--device" ]] && device=${4:?--device needs cuda or cpu}
out=${OUT:-$staging/out}
python=${DEVICE_PYTHON:-python3}
mkdir -p "$out"

found=$(find "$staging" -maxdepth 1 -name 'part-*' | wc -l)
if [[ "$found" -ne "$parts" ]]; then
  echo "device_check: $found of $parts parts in $staging; send the missing ones first" >&2
  exit 2
fi
rm -rf "$staging/bundle"
cat "$staging"/part-* | tar -x -C "$staging"
bundle=$staging/bundle

venv=$staging/venv
"$python" -m venv --system-site-packages "$venv"
# the venv's onnxruntime-gpu shadows the image's CPU onnxruntime (the same module name)
"$venv/bin/python" -m pip install --quiet --no-index --find-links "$bundle/wheels" -r "$bundle/requirements.txt" \
  >"$out/pip.txt" 2>&1 || { cat "$out/pip.txt" >&2; exit 3; }
"$venv/bin/python" -m pip list >>"$out/pip.txt" 2>&1
# onnxruntime-gpu loads CUDA and cuDNN from the library path; the image has them as nvidia-* wheels (torch's)
nvlibs=$("$venv/bin/python" -c 'import glob, os, site
print(":".join(sorted({os.path.dirname(p) for sp in site.getsitepackages()
                       for p in glob.glob(os.path.join(sp, "nvidia", "**", "lib", "*.so*"), recursive=True)})))')
export LD_LIBRARY_PATH=$nvlibs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
{ nvidia-smi 2>&1 || true; "$venv/bin/python" -c 'import onnxruntime as o; print(o.__version__, o.get_available_providers())'; } \
  >"$out/device.txt" 2>&1

export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
status=0
timeout 240 "$venv/bin/python" scripts/gpu_check.py --device "$device" --packages "$bundle"/fixtures/* \
  >"$out/gpu_check.txt" 2>&1 || status=$?
timeout 300 "$venv/bin/python" -m bench gpu --device "$device" --rounds 5 --packages "$bundle/packages" \
  --source "$bundle/minilm-source" >"$out/bench_gpu.txt" 2>&1 || status=$?
tail -n 40 "$out/gpu_check.txt" "$out/bench_gpu.txt"
exit "$status"
