"""API keys: which routes need one, where keys come from, and the constant-time check.

Keys come from ``serve --api-key-file PATH`` (one key per line; blank lines and lines starting
with ``#`` are skipped) and from the environment variable ``EDGE_RUNTIME_API_KEY``. The file is
re-read on SIGHUP, so keys rotate without a restart: add the new key, reload, move the clients,
remove the old key, reload. Without any key the server is open and an ``Authorization`` header is
ignored (the System One SDK always sends one, even to keyless servers).

A key is never logged and never echoed: messages about keys name the file and the count only.
"""

from __future__ import annotations

import hmac
import logging
import os
import threading
from collections.abc import Mapping
from pathlib import Path

ENV_VAR = "EDGE_RUNTIME_API_KEY"

# Probes and the contract document must never need a secret; /metrics is public unless the
# process is started with --metrics-require-key.
PUBLIC_PATHS = frozenset({"/health", "/health/live", "/openapi.yaml"})
METRICS_PATH = "/metrics"

log = logging.getLogger("edge_runtime.auth")


class KeyFileError(ValueError):
    """A key file that cannot be read or holds no key; the message names the file, never a key."""


def read_key_file(path: Path) -> tuple[str, ...]:
    """The keys of a key file, in file order; KeyFileError when it cannot be read or holds none."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise KeyFileError(f"cannot read API key file {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise KeyFileError(f"API key file {path} is not UTF-8") from None
    keys = tuple(line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#"))
    if not keys:
        raise KeyFileError(f"API key file {path} holds no key")
    for number, key in enumerate(keys, 1):
        check_key(key, f"API key {number} of {path}")
    try:
        if path.stat().st_mode & 0o004:
            log.warning("API key file %s is readable by every user: chmod o-r it", path)
    except OSError:  # pragma: no cover - it was just read
        pass
    return keys


def check_key(key: str, where: str) -> None:
    """A key is sent in a header: printable ASCII without spaces (RFC 6750's b64token, loosely)."""
    if not key.isascii() or not key.isprintable() or " " in key or "\t" in key:
        raise KeyFileError(f"{where} is not printable ASCII without spaces")


def bearer_token(headers: Mapping[str, str]) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header (scheme in any case), else None."""
    value = headers.get("authorization")
    if value is None:
        return None
    scheme, _, token = value.strip().partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


class ApiKeys:
    """The process's current keys; ``reload`` swaps them atomically, ``check`` reads them."""

    def __init__(self, key_file: Path | None = None, env: Mapping[str, str] | None = None) -> None:
        self.key_file = key_file
        env = os.environ if env is None else env
        self._env_key = (env.get(ENV_VAR) or "").strip() or None
        self._lock = threading.Lock()
        self._keys: tuple[bytes, ...] = ()
        self.reload(initial=True)

    @property
    def enabled(self) -> bool:
        """Whether any key is set: then every /v1/* route needs one."""
        return bool(self._keys)

    @property
    def count(self) -> int:
        return len(self._keys)

    def reload(self, initial: bool = False) -> bool:
        """Re-read the key file. At start a bad file is fatal (KeyFileError); on SIGHUP it keeps the
        keys in force and logs why, because dropping to no keys would open the server."""
        keys: list[str] = []
        if self.key_file is not None:
            try:
                keys.extend(read_key_file(self.key_file))
            except KeyFileError as exc:
                if initial:
                    raise
                log.error("API keys not reloaded, the %d in force stay: %s", len(self._keys), exc)
                return False
        if self._env_key is not None:
            check_key(self._env_key, ENV_VAR)  # fatal at start only: the value never changes
            keys.append(self._env_key)
        with self._lock:
            self._keys = tuple(k.encode("utf-8") for k in keys)
        if not initial:
            log.info("API keys reloaded: %d in force", len(keys))
        return True

    def check(self, token: str | None) -> bool:
        """Whether ``token`` is one of the keys, compared in constant time with every key.

        Every key is compared (no early exit), so the time does not tell which key matched or how
        many bytes of a key were right.
        """
        keys = self._keys
        if token is None:
            return False
        presented = token.encode("utf-8", "surrogateescape")
        found = False
        for key in keys:
            found |= hmac.compare_digest(presented, key)
        return found


def needs_key(path: str, keys: ApiKeys, metrics_require_key: bool) -> bool:
    """Whether a request to ``path`` must carry a key: every /v1/* route once keys are set."""
    if not keys.enabled or path in PUBLIC_PATHS:
        return False
    if path == METRICS_PATH:
        return metrics_require_key
    return path == "/v1" or path.startswith("/v1/")
