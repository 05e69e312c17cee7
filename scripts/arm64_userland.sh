#!/usr/bin/env bash
# Builds an aarch64 userland that QEMU's user-mode emulator runs on an x86 machine: Debian bookworm arm64
# (minbase, its Python 3.11) and a virtualenv at /opt/venv holding the runtime dependencies at the
# project's pins plus onnx (scripts/cpu_class_check.py's kernel probes), all from aarch64 wheels
# downloaded on this machine with its own pip settings. scripts/cpu_class_check.py --arch aarch64 and
# tests/test_cpu_classes.py run the project in it by chroot (only /proc mounted: with the host's /sys
# visible, `import onnxruntime` segfaults under qemu-user, docs/deployment.md).
#
#   scripts/arm64_userland.sh [ROOT]     (default: $EDGE_RUNTIME_ARM64_ROOT, else /var/cache/edge-runtime/arm64-root)
#
# Needs root and Debian: installs qemu-user-static, binfmt-support and debootstrap when missing, mounts
# binfmt_misc and enables qemu-aarch64. About 5 minutes on 2 cores. DEBIAN_MIRROR=URL for debootstrap.
# The default suite never runs this: `make arm64-userland` (and `make test-heavy`) do.
set -euo pipefail
cd "$(dirname "$0")/.."

ROOT=${1:-${EDGE_RUNTIME_ARM64_ROOT:-/var/cache/edge-runtime/arm64-root}}
PYTHON=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || command -v python3 )}
log() { printf '[arm64-userland %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

[ "$(id -u)" -eq 0 ] || { echo "scripts/arm64_userland.sh: needs root (debootstrap, chroot, binfmt_misc)" >&2; exit 1; }
scripts/qemu_binfmt.sh
command -v debootstrap >/dev/null || {
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null; }

start=$(date +%s)
if [ ! -x "$ROOT/usr/bin/python3" ]; then
    log "debootstrap --arch=arm64 bookworm into $ROOT (about 3 minutes)"
    rm -rf --one-file-system "$ROOT"
    mkdir -p "$(dirname "$ROOT")"
    debootstrap --arch=arm64 --variant=minbase --include=python3,python3-venv,ca-certificates \
        bookworm "$ROOT" ${DEBIAN_MIRROR:+"$DEBIAN_MIRROR"} >"$ROOT.debootstrap.log" 2>&1 \
        || { tail -20 "$ROOT.debootstrap.log" >&2; exit 1; }
    # debootstrap leaves /proc and /sys mounted in its target when interrupted; and an apt cache
    awk -v d="$(realpath "$ROOT")/" 'index($2, d) == 1 { print $2 }' /proc/mounts | sort -r | xargs -r umount -l
    rm -rf "$ROOT"/var/cache/apt/archives/*.deb "$ROOT"/var/lib/apt/lists/*
fi

# The wheels: the runtime pins of pyproject.toml and onnx at the convert extra's pin, for cp311 aarch64.
pins=$("$PYTHON" - <<'EOF'
import tomllib
project = tomllib.load(open("pyproject.toml", "rb"))["project"]
onnx = [p for p in project["optional-dependencies"]["convert"] if p.startswith("onnx==")]
print(" ".join(project["dependencies"] + onnx))
EOF
)
stamp="$ROOT/opt/venv/.edge-runtime-pins"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$pins" ]; then
    log "ready: $ROOT has the aarch64 venv at these pins"
    exit 0
fi
wheels="$ROOT/tmp/wheels"
mkdir -p "$wheels"
log "pip download (aarch64, cp311): $pins"
# shellcheck disable=SC2086
"$PYTHON" -m pip download --quiet --only-binary=:all: --platform manylinux_2_28_aarch64 \
    --platform manylinux_2_17_aarch64 --platform manylinux2014_aarch64 --python-version 3.11 \
    --implementation cp --abi cp311 --abi abi3 --abi none -d "$wheels" $pins
log "virtualenv /opt/venv in the aarch64 root (emulated pip: about a minute)"
# a clean environment: this machine's PIP_* settings name paths that are not in the root
in_root() { chroot "$ROOT" /usr/bin/env -i PATH=/usr/bin:/bin HOME=/root LANG=C.UTF-8 "$@"; }
in_root /usr/bin/python3 -m venv /opt/venv
# shellcheck disable=SC2086
in_root PIP_DISABLE_PIP_VERSION_CHECK=1 /opt/venv/bin/pip install --quiet --no-index --find-links /tmp/wheels $pins
rm -rf "$wheels"
in_root /opt/venv/bin/python -c "import onnxruntime, onnx, tokenizers, numpy, sanic; print('aarch64 venv:', onnxruntime.__version__)"
printf '%s' "$pins" >"$stamp"
log "ready in $(( $(date +%s) - start ))s: $ROOT ($(du -sh --one-file-system "$ROOT" | cut -f1))"
