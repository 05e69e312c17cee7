#!/usr/bin/env bash
# Builds the container images on a Debian machine with root and no container registry: makes local
# stand-ins for the two public base images, builds Dockerfile.cpu twice (packages mounted, and
# BAKE_DEFAULTS=1) and Dockerfile.gpu (up to what needs a GPU: its build checks the CUDA provider is
# in the onnxruntime-gpu wheel), and reports each image's size and build time (docs/deployment.md).
#
#   scripts/images.sh [bases|cpu|cpu-defaults|gpu|all]...     (default: all)
#
# Environment: REBUILD_BASES=1 remakes the stand-in bases; NO_CACHE=1 builds without podman's layer
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

# One minbase bookworm root filesystem, imported as an image; both stand-ins are built on it.
BASES_READY=0
make_bases() {
    [ "$BASES_READY" = 0 ] || return 0
    BASES_READY=1
    if [ "${REBUILD_BASES:-0}" != 1 ] && have_image "$PY_BASE" && have_image "$CUDA_BASE"; then
        log "stand-in bases present ($PY_BASE, $CUDA_BASE)"
        return
    fi
    local root context start
    start=$(date +%s)
    scratch root /var/tmp/edge-runtime-minbase.XXXXXX
    scratch context /tmp/edge-runtime-empty-context.XXXXXX
    log "debootstrap --variant=minbase bookworm (about a minute)"
    debootstrap --variant=minbase bookworm "$root" ${DEBIAN_MIRROR:+"$DEBIAN_MIRROR"} >"$OUT/debootstrap.log" 2>&1 \
        || { tail -20 "$OUT/debootstrap.log" >&2; exit 1; }
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
    tar -C "$root" -c . | podman import - "$MINBASE" >>"$OUT/debootstrap.log" 2>&1
    # The CUDA base's environment, without CUDA: the GPU image's build needs no GPU up to its provider check.
    podman build --isolation chroot -t "$CUDA_BASE" -f - "$context" >"$OUT/cuda-base.log" 2>&1 <<EOF || { tail -20 "$OUT/cuda-base.log" >&2; exit 1; }
FROM $MINBASE
ENV NVIDIA_VISIBLE_DEVICES=all NVIDIA_DRIVER_CAPABILITIES=compute,utility \\
    LD_LIBRARY_PATH=/usr/local/nvidia/lib:/usr/local/nvidia/lib64
CMD ["bash"]
EOF
    # python:3.11-slim-bookworm's contents as Debian packages them: python3.11 with venv, `python` on
    # PATH, CA certificates, netbase and tzdata. (The official image builds CPython 3.11 into /usr/local.)
    podman build --isolation chroot -t "$PY_BASE" -f - "$context" >"$OUT/python-base.log" 2>&1 <<EOF || { tail -20 "$OUT/python-base.log" >&2; exit 1; }
FROM $MINBASE
ENV LANG=C.UTF-8
RUN apt-get update \\
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \\
      python3.11 python3.11-venv python-is-python3 ca-certificates netbase tzdata \\
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin \\
 && python -m venv --help >/dev/null
CMD ["python3"]
EOF
    report "$CUDA_BASE" "stand-in base" "$start"
    report "$PY_BASE" "stand-in base" "$start"
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
            all) main bases cpu cpu-defaults gpu; return ;;
            *) echo "scripts/images.sh: unknown target $target (bases, cpu, cpu-defaults, gpu, all)" >&2; exit 2 ;;
        esac
    done
    column -t -s $'\t' "$REPORT" >&2 || cat "$REPORT" >&2
}

main "$@"
