"""Runs an image build that reaches the package indexes the way this machine does, leaving none of it in
the image.

    python3 scripts/build_with_pip_settings.py podman build --isolation chroot -f Dockerfile.cpu -t IMG .

This machine's effective pip settings (`pip config debug`: its config files and PIP_* variables, later
ones winning as pip applies them) become one pip.conf, passed to the build as the secret `pip.conf`; the
CA bundle pip verifies with (`cert`, else REQUESTS_CA_BUNDLE / CURL_CA_BUNDLE / SSL_CERT_FILE) is the
secret `pip-ca`. The Dockerfiles mount both for their pip commands only (`RUN --mount=type=secret`), so
they are in no layer. Local paths the settings name (find-links directories, file:// indexes,
constraint files) are served read-only over HTTP on 127.0.0.1 for as long as the command runs, and the
pip.conf names them by those URLs: a build mount (`-v`) would leave its empty mount point in the image.
`podman build --isolation chroot` shares this machine's network, so the build reaches 127.0.0.1; with
Docker add `--network host`. The build arguments are appended to the command (podman and docker accept
options after the context directory). The interpreter whose settings are read: $SETTINGS_PYTHON, else the
one running this script.
(Not PIP_PYTHON: pip reads that as its own --python option.)
"""

from __future__ import annotations

import configparser
import os
import re
import subprocess
import sys
import tempfile
import threading
import urllib.parse
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

# pip applies these variants in this order, each overriding the ones before (pip's Configuration);
# `pip config debug` lists them with their files in load order.
VARIANT_ORDER = ("global", "user", "site", "env", "env_var")
# Options whose value may name local files or directories (several, separated by whitespace).
PATH_OPTIONS = {"find-links", "index-url", "extra-index-url", "constraint", "requirement", "build-constraint"}
# Where the Dockerfiles mount the CA secret; a target outside /run/secrets leaves no mount point behind.
CA_TARGET = "/etc/pip-ca.crt"

HEADER = re.compile(r"^(?P<variant>[a-z_]+):$")
FILE_KEY = re.compile(r"^(?P<section>[^.\s]+)\.(?P<option>\S+): (?P<value>.*)$")
ENV_VAR = re.compile(r"^PIP_(?P<name>[A-Z0-9_]+)=(?P<value>.*)$")


def unquote(value: str) -> str:
    value = value.strip()
    if len(value) >= 2 and value[0] in "'\"" and value[-1] == value[0]:
        return value[1:-1]
    return value


def effective_settings(python: str) -> dict[tuple[str, str], str]:
    """(section, option) -> value after pip's own precedence, read from `pip config debug`."""
    try:
        result = subprocess.run([python, "-m", "pip", "config", "debug"], capture_output=True, text=True,
                                env=dict(os.environ, PIP_DISABLE_PIP_VERSION_CHECK="1"))
    except OSError as exc:
        raise SystemExit(f"build_with_pip_settings: cannot run {python}: {exc}") from exc
    if result.returncode != 0:
        # No pip for that interpreter (Debian's python3 without python3-pip): no settings to pass on,
        # but the CA bundle from the environment still is.
        print(f"build_with_pip_settings: no pip settings from {python}: {result.stderr.strip()[-200:]}",
              file=sys.stderr)
        return {}
    return parse_config_debug(result.stdout)


def parse_config_debug(out: str) -> dict[tuple[str, str], str]:
    """`pip config debug`'s listing merged as pip merges it: (section, option) -> value."""
    by_variant: dict[str, list[tuple[tuple[str, str], str]]] = {v: [] for v in VARIANT_ORDER}
    variant = ""
    for raw in out.splitlines():
        line = raw.strip()
        if m := HEADER.match(raw):
            variant = m["variant"]
        elif variant == "env_var" and (m := ENV_VAR.match(line)):
            # PIP_FIND_LINKS applies to every command, as [global] find-links does.
            option = m["name"].lower().replace("_", "-")
            by_variant[variant].append((("global", option), unquote(m["value"])))
        elif m := FILE_KEY.match(line):
            by_variant.setdefault(variant, []).append(((m["section"], m["option"]), unquote(m["value"])))
    merged: dict[tuple[str, str], str] = {}
    for variant in VARIANT_ORDER:
        merged.update(by_variant.get(variant, []))
    return merged


def ca_bundle(settings: dict[tuple[str, str], str]) -> Path | None:
    """The CA bundle pip verifies with here, or None when it uses its own (certifi)."""
    for (section, option), value in settings.items():
        if option == "cert" and section in ("global", "install", "download") and Path(value).is_file():
            return Path(value)
    for name in ("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "SSL_CERT_FILE"):
        value = os.environ.get(name, "")
        if value and Path(value).is_file():
            return Path(value)
    return None


class LocalPaths:
    """Local files and directories published as http://127.0.0.1:PORT/<n>/..., one number per root."""

    def __init__(self) -> None:
        self.roots: list[Path] = []
        self.base = ""  # set once the server has a port

    def url(self, token: str) -> str:
        """The URL that replaces one path-valued token (unchanged when it names nothing local)."""
        text = token[len("file://"):] if token.startswith("file://") else token
        path = Path(urllib.parse.unquote(text).rstrip("/") or "/")
        if not text.startswith("/") or not path.exists():
            return token
        # A file:// index laid out as ROOT/simple/NAME/index.html links to its files as ../../files/...:
        # publish ROOT, so those links resolve.
        root = path.parent if token.startswith("file://") and path.name == "simple" else path
        if root not in self.roots:
            self.roots.append(root)
        number = self.roots.index(root)
        if root.is_file():
            return f"{self.base}/{number}/{urllib.parse.quote(root.name)}"  # that one file, nothing beside it
        rel = path.relative_to(root).as_posix()
        tail = "" if rel == "." else rel + ("/" if path.is_dir() else "")
        return f"{self.base}/{number}/{urllib.parse.quote(tail)}"

    def translate(self, url_path: str) -> str | None:
        """The file a request path names, or None outside every root."""
        parts = urllib.parse.unquote(url_path.split("?", 1)[0]).lstrip("/").split("/")
        if not parts or not parts[0].isdigit() or int(parts[0]) >= len(self.roots):
            return None
        root = self.roots[int(parts[0])].resolve()
        if root.is_file():
            return str(root) if parts[1:] == [root.name] else None
        target = root.joinpath(*parts[1:]).resolve()
        return str(target) if target == root or root in target.parents else None


class Handler(SimpleHTTPRequestHandler):
    """Serves LocalPaths only (directory listings too: pip reads find-links pages as links), GET/HEAD."""

    def __init__(self, *args: Any, paths: LocalPaths, **kwargs: Any) -> None:
        self.paths = paths
        super().__init__(*args, **kwargs)

    def translate_path(self, path: str) -> str:
        return self.paths.translate(path) or "/nonexistent/"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        pass  # pip reports what it fetched; a line per file here would bury the build log


def write_settings(outdir: Path, settings: dict[tuple[str, str], str], paths: LocalPaths) -> list[str]:
    """Write outdir/pip.conf (and outdir/pip-ca); return the build arguments that pass them as secrets."""
    args: list[str] = []
    ca = ca_bundle(settings)
    if ca is not None:
        (outdir / "pip-ca").write_bytes(ca.read_bytes())
        args += ["--secret", f"id=pip-ca,src={outdir / 'pip-ca'}"]
    conf = configparser.ConfigParser(interpolation=None)
    for (section, option), value in sorted(settings.items()):
        if option == "cert":
            continue  # the secret's path replaces it below
        if not conf.has_section(section):
            conf.add_section(section)
        conf.set(section, option, " ".join(paths.url(t) for t in value.split()) if option in PATH_OPTIONS
                 else value)
    if ca is not None:
        if not conf.has_section("global"):
            conf.add_section("global")
        conf.set("global", "cert", CA_TARGET)
    with open(outdir / "pip.conf", "w", encoding="utf-8") as f:
        conf.write(f)
    return args + ["--secret", f"id=pip.conf,src={outdir / 'pip.conf'}"]


def main() -> int:
    command = sys.argv[1:]
    if not command:
        print(__doc__, file=sys.stderr)
        return 2
    settings = effective_settings(os.environ.get("SETTINGS_PYTHON", sys.executable))
    paths = LocalPaths()
    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(Handler, paths=paths))
    paths.base = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, name="pip-settings-http", daemon=True)
    with tempfile.TemporaryDirectory(prefix="edge-runtime-pip-") as tmp:
        args = write_settings(Path(tmp), settings, paths)
        print(f"build_with_pip_settings: pip.conf for the build:\n{(Path(tmp) / 'pip.conf').read_text()}",
              file=sys.stderr, flush=True)
        thread.start()
        try:
            return subprocess.run([*command, *args]).returncode
        finally:
            server.shutdown()
            server.server_close()


if __name__ == "__main__":
    raise SystemExit(main())
