#!/usr/bin/env bash
# Makes this x86 machine run aarch64 programs: Debian's qemu-user-static and binfmt-support installed
# when missing, binfmt_misc mounted, and qemu-aarch64 registered with the F flag (the emulator is opened
# at registration, so it also runs inside a chroot or a `podman build --arch arm64`). Needs root.
# Used by scripts/arm64_userland.sh and scripts/images.sh; exits 0 when aarch64 programs can run.
set -euo pipefail
[ "$(id -u)" -eq 0 ] || { echo "scripts/qemu_binfmt.sh: needs root" >&2; exit 1; }
if ! command -v qemu-aarch64-static >/dev/null || ! command -v update-binfmts >/dev/null; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq qemu-user-static binfmt-support >/dev/null
fi
binfmt=/proc/sys/fs/binfmt_misc
[ -e "$binfmt/register" ] || mount -t binfmt_misc binfmt_misc "$binfmt"
[ -e "$binfmt/qemu-aarch64" ] || update-binfmts --import qemu-aarch64 >/dev/null 2>&1 || true
update-binfmts --enable qemu-aarch64 >/dev/null 2>&1 || true
grep -q '^flags: .*F' "$binfmt/qemu-aarch64" \
    || { echo "scripts/qemu_binfmt.sh: qemu-aarch64 is not registered with the F flag" >&2; exit 1; }
