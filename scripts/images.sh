#!/usr/bin/env bash
# Builds the container images on a Debian machine with root and no container registry: makes local
# stand-ins for the two public base images, builds Dockerfile.cpu twice (packages mounted, and
# BAKE_DEFAULTS=1) and Dockerfile.gpu (up to what needs a GPU: its build checks the CUDA provider is
# in the onnxruntime-gpu wheel), and reports each image's size and build time (docs/deployment.md).
# Both CPU images are also built for linux/arm64 under QEMU emulation (qemu-user-static registered with
# binfmt_misc: scripts/qemu_binfmt.sh): an arm64 stand-in python base, Dockerfile.cpu with IMPORT_CHECK=0
# (the image's import of onnxruntime is then checked by chroot, /sys hidden), and the defaults image as
# the arm64 CPU image plus the packages the amd64 build converted (ONNX packages fit every architecture).
#
#   scripts/images.sh [bases|cpu|cpu-defaults|gpu|bases-arm64|cpu-arm64|cpu-defaults-arm64|all]...
#                                                                   (default: all, for ARCHES="amd64 arm64")
#
# Environment: ARCHES=amd64 makes `all` build for amd64 only; REBUILD_BASES=1 remakes the stand-in bases;
# NO_CACHE=1 builds without podman's layer
# cache; COMPRESSED=0 skips the gzip size (it costs a minute or so on 2 cores); DEBIAN_MIRROR=URL for
# debootstrap (its default otherwise). The builds reach the package indexes the way this machine does
# (scripts/build_with_pip_settings.py: its pip settings and CA bundle as build secrets, local
# indexes served on 127.0.0.1 while the build runs; none of it in a layer). Results: build/images/report.tsv.
set -euo pipefail
cd "$(dirname "$0")/.."

MINBASE=localhost/standin/debian:bookworm-minbase
PY_BASE=localhost/standin/python:3.11-slim-bookworm
CUDA_BASE=localhost/standin/cuda:13-cudnn-runtime-bookworm
CPU_IMAGE=localhost/edge-runtime:cpu
CPU_DEFAULTS_IMAGE=localhost/edge-runtime:cpu-defaults
MINBASE_ARM64=localhost/standin/debian:bookworm-minbase-arm64
PY_BASE_ARM64=localhost/standin/python:3.11-slim-bookworm-arm64
CPU_IMAGE_ARM64=localhost/edge-runtime:cpu-arm64
CPU_DEFAULTS_IMAGE_ARM64=localhost/edge-runtime:cpu-defaults-arm64
GPU_IMAGE=localhost/edge-runtime:gpu
OUT=build/images
REPORT="$OUT/report.tsv"

# Scratch directories (the base root filesystem, an empty build context): removed however the script ends.
SCRATCH=()
cleanup() {
    local d
    for d in "${SCRATCH[@]}"; do
        # debootstrap mounts /proc and /sys inside its target; an interrupted run leaves them there.
        awk -v d="$d/" 'index($2, d) == 1 { print $2 }' /proc/mounts | sort -r | xargs -r umount -l
        rm -rf --one-file-system "$d"
    done
}
trap cleanup EXIT
scratch() { local -n dir=$1; dir=$(mktemp -d "$2"); SCRATCH+=("$dir"); }

log() { printf '[images %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

need_tools() {
    [ "$(id -u)" -eq 0 ] || { echo "scripts/images.sh: needs root (debootstrap, podman's root storage)" >&2; exit 1; }
    local missing=()
    command -v podman >/dev/null || missing+=(podman)
    command -v debootstrap >/dev/null || missing+=(debootstrap)
    if [ "${#missing[@]}" -gt 0 ]; then
        log "installing ${missing[*]} from the Debian packages"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
    fi
}

have_image() { podman image exists "$1"; }

# A minbase bookworm root filesystem for $1 (amd64 or arm64: debootstrapped under emulation), slimmed as
# debian:bookworm-slim is, imported as the image $2 of that architecture.
make_minbase() {
    local arch=$1 image=$2 root
    scratch root /var/tmp/edge-runtime-minbase.XXXXXX
    log "debootstrap --arch=$arch --variant=minbase bookworm (about a minute; arm64 under emulation: several)"
    debootstrap --arch="$arch" --variant=minbase bookworm "${root:?}" ${DEBIAN_MIRROR:+"$DEBIAN_MIRROR"} \
        >"$OUT/debootstrap-$arch.log" 2>&1 || { tail -20 "$OUT/debootstrap-$arch.log" >&2; exit 1; }
    # As debian:bookworm-slim does: no docs, man pages or locales from later installs, no apt lists.
    cat >"$root/etc/dpkg/dpkg.cfg.d/docker-slim" <<'EOF'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
EOF
    find "$root/usr/share/doc" -mindepth 2 ! -name copyright ! -type d -delete
    rm -rf "$root"/usr/share/man/* "$root"/usr/share/info/* "$root"/usr/share/locale/* \
        "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin "$root"/var/cache/apt/archives/*.deb
    tar -C "$root" -c . | podman import --arch "$arch" - "$image" >>"$OUT/debootstrap-$arch.log" 2>&1
}

# python:3.11-slim-bookworm's contents as Debian packages them, on the minbase image $1, as the image $2
# for $3: python3.11 with venv, `python` on PATH, CA certificates, netbase and tzdata. (The official image
# builds CPython 3.11 into /usr/local.)
make_python_base() {
    local minbase=$1 image=$2 arch=$3 context
    scratch context /tmp/edge-runtime-empty-context.XXXXXX
    podman build --isolation chroot --arch "$arch" -t "$image" -f - "$context" >"$OUT/python-base-$arch.log" 2>&1 <<EOF || { tail -20 "$OUT/python-base-$arch.log" >&2; exit 1; }
FROM $minbase
ENV LANG=C.UTF-8
RUN apt-get update \\
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \\
      python3.11 python3.11-venv python-is-python3 ca-certificates netbase tzdata \\
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin \\
 && python -m venv --help >/dev/null
CMD ["python3"]
EOF
}

# The amd64 stand-ins, both on one minbase: the python base and the CUDA base.
BASES_READY=0
make_bases() {
    [ "$BASES_READY" = 0 ] || return 0
    BASES_READY=1
    if [ "${REBUILD_BASES:-0}" != 1 ] && have_image "$PY_BASE" && have_image "$CUDA_BASE"; then
        log "stand-in bases present ($PY_BASE, $CUDA_BASE)"
        return
    fi
    local context start
    start=$(date +%s)
    scratch context /tmp/edge-runtime-empty-context.XXXXXX
    make_minbase amd64 "$MINBASE"
    # The CUDA base's environment, without CUDA: the GPU image's build needs no GPU up to its provider check.
    podman build --isolation chroot -t "$CUDA_BASE" -f - "$context" >"$OUT/cuda-base.log" 2>&1 <<EOF || { tail -20 "$OUT/cuda-base.log" >&2; exit 1; }
FROM $MINBASE
ENV NVIDIA_VISIBLE_DEVICES=all NVIDIA_DRIVER_CAPABILITIES=compute,utility \\
    LD_LIBRARY_PATH=/usr/local/nvidia/lib:/usr/local/nvidia/lib64
CMD ["bash"]
EOF
    make_python_base "$MINBASE" "$PY_BASE" amd64
    report "$CUDA_BASE" "stand-in base" "$start"
    report "$PY_BASE" "stand-in base" "$start"
}

# The arm64 python stand-in, debootstrapped and built under emulation.
BASES_ARM64_READY=0
make_bases_arm64() {
    [ "$BASES_ARM64_READY" = 0 ] || return 0
    BASES_ARM64_READY=1
    scripts/qemu_binfmt.sh
    if [ "${REBUILD_BASES:-0}" != 1 ] && have_image "$PY_BASE_ARM64"; then
        log "arm64 stand-in base present ($PY_BASE_ARM64)"
        return
    fi
    local start
    start=$(date +%s)
    make_minbase arm64 "$MINBASE_ARM64"
    make_python_base "$MINBASE_ARM64" "$PY_BASE_ARM64" arm64
    report "$PY_BASE_ARM64" "stand-in base (arm64, emulated)" "$start"
}

# What IMPORT_CHECK=0 left out of an emulated build: the image's own interpreter imports the server and
# onnxruntime, chroot-ed into the image with only /proc mounted (with the host's /sys visible, onnxruntime
# segfaults under qemu-user) in a private mount namespace, as a plain-NEON core (QEMU_CPU=cortex-a72).
check_emulated_import() {
    local image=$1 root status=0
    root=$(podman image mount "$image")
    # shellcheck disable=SC2016  # $1 is the inner shell's
    unshare --mount --propagation private sh -c 'mount -t proc proc "$1/proc" && exec chroot "$1" /usr/bin/env -i \
        QEMU_CPU=cortex-a72 PATH=/opt/venv/bin:/usr/bin:/bin /opt/venv/bin/python -c \
        "import platform, edge_runtime.cli, onnxruntime; print(platform.machine(), onnxruntime.__version__)"' \
        check "$root" >"$OUT/import-check-arm64.log" 2>&1 || status=$?
    podman image unmount "$image" >/dev/null
    if [ "$status" -ne 0 ] || ! grep -q '^aarch64 ' "$OUT/import-check-arm64.log"; then
        tail -20 "$OUT/import-check-arm64.log" >&2
        log "FAILED: $image does not import onnxruntime under emulation"
        exit 1
    fi
    log "$image imports onnxruntime under emulation: $(grep '^aarch64 ' "$OUT/import-check-arm64.log")"
}

# The arm64 image with the default packages: the arm64 CPU image plus the packages the amd64 build
# converted into its /models (converting under emulation would run torch in QEMU for nothing).
build_defaults_arm64() {
    local start context root
    have_image "$CPU_DEFAULTS_IMAGE" || main cpu-defaults
    start=$(date +%s)
    scratch context /tmp/edge-runtime-defaults-context.XXXXXX
    root=$(podman image mount "$CPU_DEFAULTS_IMAGE")
    cp -a "$root/models" "$context/models"
    podman image unmount "$CPU_DEFAULTS_IMAGE" >/dev/null
    rm "$context/models/models.yaml"  # the CPU image has its own (deploy/models.container.yaml)
    log "podman build $CPU_DEFAULTS_IMAGE_ARM64: $CPU_IMAGE_ARM64 + the packages of $CPU_DEFAULTS_IMAGE"
    podman build --isolation chroot --arch arm64 --format docker -t "$CPU_DEFAULTS_IMAGE_ARM64" -f - "$context" \
        >"$OUT/cpu-defaults-arm64.log" 2>&1 <<EOF || { tail -20 "$OUT/cpu-defaults-arm64.log" >&2; exit 1; }
FROM $CPU_IMAGE_ARM64
COPY models /models
EOF
    report "$CPU_DEFAULTS_IMAGE_ARM64" "$CPU_IMAGE_ARM64 + the packages of $CPU_DEFAULTS_IMAGE" "$start"
}

# podman build with this machine's pip settings, in Docker's image format (the OCI format has no
# HEALTHCHECK); records the wall time.
build() {
    local image=$1 dockerfile=$2 start status=0
    shift 2
    local log_file
    log_file="$OUT/$(echo "$image" | tr '/:' '__').log"
    log "podman build $image from $dockerfile $* (log: $log_file)"
    start=$(date +%s)
    SETTINGS_PYTHON="$(pip_python)" python3 scripts/build_with_pip_settings.py \
        podman build --isolation chroot --format docker ${NO_CACHE:+--no-cache} -f "$dockerfile" -t "$image" "$@" . \
        >"$log_file" 2>&1 || status=$?
    if [ "$status" -ne 0 ]; then
        tail -40 "$log_file" >&2
        log "FAILED: $image (exit $status, full log $log_file)"
        exit "$status"
    fi
    # The OCI image format has no HEALTHCHECK: podman drops it (with a warning) unless --format docker.
    if [ "$(podman image inspect --format '{{json .HealthCheck}}' "$image")" = null ]; then
        log "FAILED: $image has no HEALTHCHECK"
        exit 1
    fi
    report "$image" "$dockerfile $*" "$start"
}

# The interpreter whose pip settings the builds use: the project's venv if there is one.
pip_python() { if [ -x .venv/bin/python ]; then echo .venv/bin/python; else command -v python3; fi; }

report() {
    local image=$1 what=$2 start=$3 seconds bytes gz="-"
    seconds=$(( $(date +%s) - start ))
    bytes=$(podman image inspect --format '{{.Size}}' "$image")
    if [ "${COMPRESSED:-1}" = 1 ]; then
        # What a registry would store and a node would pull: the layers gzip-compressed.
        gz=$(podman save --format docker-archive "$image" 2>/dev/null | gzip -6 | wc -c)
    fi
    printf '%s\t%s\t%s\t%s\t%s\n' "$image" "$bytes" "$gz" "$seconds" "$what" >>"$REPORT"
    log "$image: $((bytes / 1000000)) MB, $([ "$gz" = - ] && echo - || echo $((gz / 1000000))) MB gzipped, built in ${seconds}s"
}

main() {
    need_tools
    mkdir -p "$OUT"
    [ -f "$REPORT" ] || printf 'image\tbytes\tgzip_bytes\tbuild_seconds\tbuilt_with\n' >"$REPORT"
    local targets=("$@")
    [ "${#targets[@]}" -gt 0 ] || targets=(all)
    for target in "${targets[@]}"; do
        case "$target" in
            bases) make_bases ;;
            cpu) make_bases; build "$CPU_IMAGE" Dockerfile.cpu --build-arg "PYTHON_IMAGE=$PY_BASE" ;;
            cpu-defaults)
                make_bases
                # TORCH_INDEX_URL empty: torch==2.13.0 comes from this machine's pip settings (the build
                # fails if that resolves to a CUDA torch).
                build "$CPU_DEFAULTS_IMAGE" Dockerfile.cpu --build-arg "PYTHON_IMAGE=$PY_BASE" \
                    --build-arg BAKE_DEFAULTS=1 --build-arg TORCH_INDEX_URL= ;;
            gpu) make_bases; build "$GPU_IMAGE" Dockerfile.gpu --build-arg "CUDA_IMAGE=$CUDA_BASE" \
                    --build-arg "PYTHON_IMAGE=$PY_BASE" ;;
            bases-arm64) make_bases_arm64 ;;
            cpu-arm64)
                make_bases_arm64
                build "$CPU_IMAGE_ARM64" Dockerfile.cpu --arch arm64 --build-arg "PYTHON_IMAGE=$PY_BASE_ARM64" \
                    --build-arg IMPORT_CHECK=0
                check_emulated_import "$CPU_IMAGE_ARM64" ;;
            cpu-defaults-arm64)
                have_image "$CPU_IMAGE_ARM64" || main cpu-arm64
                build_defaults_arm64 ;;
            all)
                local arches=" ${ARCHES:-amd64 arm64} "
                if [[ "$arches" == *" amd64 "* ]]; then main bases cpu cpu-defaults gpu; fi
                if [[ "$arches" == *" arm64 "* ]]; then main cpu-arm64 cpu-defaults-arm64; fi
                return ;;
            *) echo "scripts/images.sh: unknown target $target (bases, cpu, cpu-defaults, gpu, bases-arm64," \
                    "cpu-arm64, cpu-defaults-arm64, all)" >&2; exit 2 ;;
        esac
    done
    column -t -s $'\t' "$REPORT" >&2 || cat "$REPORT" >&2
}

main "$@"
