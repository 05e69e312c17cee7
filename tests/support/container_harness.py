"""Runs a built image's command from its mounted filesystem, as a container runtime would, without one.

`podman run` cannot start a container on the machines this project is built on (it may not raise
resource limits, and the cgroup layout is hybrid), so this does by hand what a runtime does, with
util-linux and coreutils, as root:

- `podman image mount` gives the image's root filesystem; it is bind-mounted read-only (as
  `docker run --read-only`), and only the image's declared VOLUMEs get a writable tmpfs;
- new mount, PID, UTS and network namespaces (`unshare`): the command is PID 1, as in a container, and
  sees only a loopback interface, so the image's `--host 0.0.0.0` reaches nothing outside;
- /proc, a minimal /dev (null, zero, full, random, urandom, tty, shm) and a read-only /sys, as Docker
  mounts them;
- directories bind-mounted read-only where asked (`docker run -v DIR:/models:ro`);
- `chroot --userspec=UID:GID` into it with the image's Env (plus HOME and HOSTNAME as Docker sets them),
  WorkingDir and Cmd.

What still differs from `docker run` (docs/deployment.md): no cgroup limits (--cpus, --memory), no
seccomp profile or dropped capabilities beyond the user switch, no published port, no /etc/hosts or
/etc/resolv.conf bind mounts. The test's HTTP client joins the network namespace from one thread
(`setns` applies to the calling thread only for network namespaces).
"""

from __future__ import annotations

import ctypes
import json
import os
import shlex
import signal
import subprocess
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import httpx

CLONE_NEWNET = 0x40000000
T = TypeVar("T")


def podman(*args: str) -> str:
    return subprocess.run(["podman", *args], check=True, capture_output=True, text=True).stdout.strip()


def image_config(image: str) -> dict[str, Any]:
    """The image's config (Env, Cmd, User, WorkingDir, Volumes, Healthcheck), Docker's field names."""
    inspect = json.loads(podman("image", "inspect", image))[0]
    config = dict(inspect.get("Config") or {})
    # podman reports the Docker-format HEALTHCHECK at the top level, not in Config.
    config["Healthcheck"] = config.get("Healthcheck") or inspect.get("Healthcheck")
    return config


def home_of(root: Path, uid: int) -> str:
    """HOME as Docker sets it: the user's home in the image's /etc/passwd, else /."""
    for line in (root / "etc" / "passwd").read_text(encoding="utf-8").splitlines():
        fields = line.split(":")
        if len(fields) >= 6 and fields[2] == str(uid):
            return fields[5]
    return "/"


SETUP = r"""
set -eu
R=$1; shift
ip link set lo up
mount --bind "$R" "$R"
mount -o remount,bind,ro "$R"
mount -t proc -o nosuid,nodev,noexec proc "$R/proc"
mount -t tmpfs -o nosuid,mode=755,size=64k tmpfs "$R/dev"
for d in null zero full random urandom tty; do
    touch "$R/dev/$d"
    mount --bind "/dev/$d" "$R/dev/$d"
done
mkdir "$R/dev/shm" "$R/dev/pts"
mount -t tmpfs -o nosuid,nodev,noexec,size=64m tmpfs "$R/dev/shm"
ln -s /proc/self/fd "$R/dev/fd"
ln -s /proc/self/fd/0 "$R/dev/stdin"
ln -s /proc/self/fd/1 "$R/dev/stdout"
ln -s /proc/self/fd/2 "$R/dev/stderr"
[ "$CONTAINER_SYSFS" = 0 ] || mount -t sysfs -o ro,nosuid,nodev,noexec sysfs "$R/sys"
hostname "$CONTAINER_HOSTNAME"
for v in $CONTAINER_VOLUMES; do
    mount -t tmpfs -o nosuid,nodev,mode=1777 tmpfs "$R$v"
done
# SRC:DST pairs, in order (a later one may land inside an earlier one), read-only as `-v SRC:DST:ro`.
for b in $CONTAINER_BINDS; do
    mount --bind "${b%%:*}" "$R${b#*:}"
    mount -o remount,bind,ro "$R${b#*:}"
done
exec chroot --userspec="$CONTAINER_USER" "$R" "$@"
"""


class Container:
    """The image's Cmd running in its own namespaces over its read-only root filesystem."""

    def __init__(self, root: Path, config: dict[str, Any], log: Path, hostname: str = "edge-runtime-test",
                 binds: tuple[tuple[Path, str], ...] = (), env: tuple[str, ...] = (), sysfs: bool = True) -> None:
        """``binds``: (host path, container path) pairs mounted read-only, as `docker run -v SRC:DST:ro`;
        the container path must exist in the image (its root filesystem is read-only). ``env``: more
        NAME=VALUE pairs (`docker run -e`). ``sysfs`` False leaves /sys empty: an image of another
        architecture runs under qemu-user, where onnxruntime's cpuinfo crashes on the host's /sys."""
        self.root = root
        self.config = config
        user = config.get("User") or "0:0"
        uid, _, gid = user.partition(":")
        self.uid, self.gid = int(uid), int(gid or uid)
        self.env = [*config.get("Env", []), f"HOME={home_of(root, self.uid)}", f"HOSTNAME={hostname}", *env]
        self.workdir = config.get("WorkingDir") or "/"
        self.volumes = sorted(config.get("Volumes") or {})
        self.log_path = log
        self._log = open(log, "wb")  # noqa: SIM115 - the container writes it until stop()
        argv = ["/usr/bin/env", "-i", "-C", self.workdir, *self.env, *config["Cmd"]]
        self.started = time.monotonic()
        self.proc = subprocess.Popen(
            ["unshare", "--mount", "--net", "--pid", "--uts", "--fork", "--propagation", "private",
             "sh", "-c", SETUP, "container-setup", str(root), *argv],
            env=dict(os.environ, CONTAINER_USER=f"{self.uid}:{self.gid}", CONTAINER_HOSTNAME=hostname,
                     CONTAINER_VOLUMES=" ".join(self.volumes), CONTAINER_SYSFS="1" if sysfs else "0",
                     CONTAINER_BINDS=" ".join(f"{src}:{dst}" for src, dst in binds)),
            stdout=self._log, stderr=subprocess.STDOUT,
        )
        self.pid = self._init_pid()
        self._net = ThreadPoolExecutor(1, initializer=self._join_netns, thread_name_prefix="container-net")
        self._client: httpx.Client | None = None

    def _init_pid(self, timeout: float = 10.0) -> int:
        """The host PID of the container's PID 1 (unshare's one child)."""
        deadline = time.monotonic() + timeout
        children = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children")
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the container exited with {self.proc.returncode}:\n{self.log()}")
            pids = children.read_text().split() if children.exists() else []
            if pids:
                return int(pids[0])
            time.sleep(0.01)
        raise TimeoutError("unshare started no child")

    def _join_netns(self) -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        fd = os.open(f"/proc/{self.pid}/ns/net", os.O_RDONLY)
        try:
            if libc.setns(fd, CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), "setns(CLONE_NEWNET)")
        finally:
            os.close(fd)

    def in_netns(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` on the thread inside the container's network namespace."""
        return self._net.submit(fn).result()

    def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """One HTTP request to the container's port 8100 on its loopback."""
        def send() -> httpx.Response:
            if self._client is None:
                self._client = httpx.Client(base_url="http://127.0.0.1:8100", timeout=60.0)
            return self._client.request(method, path, **kwargs)

        return self.in_netns(send)

    def exec(self, argv: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
        """`docker exec`: the command in every namespace of PID 1, its root and working directory, as
        the image's user with the image's environment."""
        return subprocess.run(
            ["nsenter", "--target", str(self.pid), "--mount", "--uts", "--net", "--pid", "--root", "--wd",
             f"--setuid={self.uid}", f"--setgid={self.gid}", "/usr/bin/env", "-i", *self.env, *argv],
            capture_output=True, text=True, timeout=timeout,
        )

    def uid_of_init(self) -> tuple[int, int]:
        """(real uid, real gid) of PID 1 as the host sees them."""
        status = Path(f"/proc/{self.pid}/status").read_text()
        fields = {k: v.split() for k, _, v in (line.partition(":") for line in status.splitlines())}
        return int(fields["Uid"][0]), int(fields["Gid"][0])

    def terminate(self, timeout: float) -> int:
        """SIGTERM to PID 1 (as `docker stop`); its exit status, or raises if it outlives ``timeout``."""
        os.kill(self.pid, signal.SIGTERM)
        return self.proc.wait(timeout)

    def log(self) -> str:
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text(errors="replace")[-8000:]

    def close(self) -> None:
        if self._client is not None:
            self.in_netns(self._client.close)
        self._net.shutdown(wait=True)
        if self.proc.poll() is None:
            os.kill(self.pid, signal.SIGKILL)  # PID 1's death ends the namespace's every process
            self.proc.wait(10)
        self._log.close()

    def describe(self) -> str:
        return (f"unshare -mnpu --fork; chroot --userspec={self.uid}:{self.gid} {self.root}; "
                f"volumes {self.volumes}; cmd {shlex.join(self.config['Cmd'])}")
