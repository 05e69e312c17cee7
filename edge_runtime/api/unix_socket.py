"""The Unix domain socket a managed runtime serves on (``serve --uds PATH``).

The Router gives each process it starts a socket path in a private directory. The directory is
created owner-only (0700) when missing; an existing file that is not a socket is refused, a socket
that still answers belongs to a live server and is refused too, and a stale one (nobody listening:
a runtime that was killed) is replaced. The socket is bound under a temporary name, made owner-only,
listening, and then renamed into place, so a client never finds a socket that refuses it; it is
removed on exit unless another server has taken the path since.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
import stat
from dataclasses import dataclass
from pathlib import Path

#: sockaddr_un's path holds 108 bytes on Linux, the terminating NUL included.
MAX_PATH_BYTES = 107
BACKLOG = 1024


class SocketError(Exception):
    """The socket path cannot be served: the message says why."""


@dataclass(frozen=True)
class UnixListener:
    """A listening socket and the file it was bound to (its inode tells it from a later server's)."""

    sock: socket.socket
    path: Path
    inode: tuple[int, int]

    def remove(self) -> None:
        """Remove the socket file at exit, unless another server has put its own there since."""
        try:
            there = self.path.lstat()
        except OSError:
            return
        if (there.st_ino, there.st_dev) == self.inode:
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()


def bind_unix_socket(path: Path) -> UnixListener:
    """A listening socket at ``path`` (see the module)."""
    path = path.absolute()
    if len(os.fsencode(path)) > MAX_PATH_BYTES:
        raise SocketError(f"the path is {len(os.fsencode(path))} bytes; a Unix socket path holds at most "
                          f"{MAX_PATH_BYTES}")
    folder = path.parent
    if not folder.exists():
        try:
            folder.mkdir(mode=0o700, parents=True)
        except OSError as exc:
            raise SocketError(f"cannot create its directory {folder}: {exc.strerror}") from None
    elif not folder.is_dir():
        raise SocketError(f"{folder} is not a directory")
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        mode = None
    if mode is not None:
        if not stat.S_ISSOCK(mode):
            raise SocketError("a file that is not a socket is already there; it is left alone")
        if _answers(path):
            raise SocketError("another server is listening on it")
    temporary = path.with_name(f".{path.name}.{secrets.token_hex(4)}")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(os.fspath(temporary))
        try:
            os.chmod(temporary, 0o600)
            sock.listen(BACKLOG)
            os.replace(temporary, path)  # replaces a stale socket in one step
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                temporary.unlink()
            raise
    except OSError as exc:
        sock.close()
        raise SocketError(f"cannot bind it: {exc.strerror or exc}") from None
    sock.set_inheritable(True)
    there = path.lstat()
    return UnixListener(sock, path, (there.st_ino, there.st_dev))


def _answers(path: Path) -> bool:
    """Whether a server accepts connections on the socket at ``path``."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(1.0)
        try:
            probe.connect(os.fspath(path))
        except OSError:
            return False
    return True
