"""scripts/build_with_pip_settings.py: the machine's pip settings reach an image build as secrets and
loopback URLs, with pip's precedence, and its HTTP server publishes nothing beyond the named paths."""

from __future__ import annotations

import configparser
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.scripts import load_script
from tests.support.server_harness import ROOT

SCRIPT = ROOT / "scripts" / "build_with_pip_settings.py"


bws = load_script(SCRIPT)

DEBUG = """\
env_var:
  PIP_FIND_LINKS='/opt/env-wheels'
  PIP_DEFAULT_TIMEOUT='180'
env:
global:
  /etc/xdg/pip/pip.conf, exists: True
    global.constraint: /etc/xdg/pip/constraints.txt
    global.index-url: https://global.invalid/simple
  /etc/pip.conf, exists: True
    global.cert: /etc/ssl/certs/ca-certificates.crt
site:
  /venv/pip.conf, exists: False
user:
  /root/.config/pip/pip.conf, exists: True
    global.find-links: /opt/wheels
    global.index-url: https://user.invalid/simple
    install.no-binary: :none:
"""


def test_settings_merge_with_pips_precedence() -> None:
    merged = bws.parse_config_debug(DEBUG)
    assert merged[("global", "index-url")] == "https://user.invalid/simple"  # user overrides global
    assert merged[("global", "find-links")] == "/opt/env-wheels"  # PIP_* overrides every file
    assert merged[("global", "default-timeout")] == "180"
    assert merged[("global", "cert")] == "/etc/ssl/certs/ca-certificates.crt"
    assert merged[("install", "no-binary")] == ":none:"


@pytest.fixture()
def tree(tmp_path: Path) -> Path:
    """A file:// index (ROOT/simple/NAME/index.html linking ../../files/...), a find-links directory, a
    constraints file with a secret beside it."""
    index = tmp_path / "pypi"
    (index / "simple" / "demo").mkdir(parents=True)
    (index / "files").mkdir()
    (index / "files" / "demo-1.0-py3-none-any.whl").write_bytes(b"wheel")
    (index / "simple" / "demo" / "index.html").write_text(
        '<a href="../../files/demo-1.0-py3-none-any.whl">demo-1.0-py3-none-any.whl</a>')
    (tmp_path / "wheels").mkdir()
    (tmp_path / "wheels" / "torch-2.13.0+cpu-cp311-cp311-linux_x86_64.whl").write_bytes(b"torch")
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "constraints.txt").write_text("torch<=2.14.1\n")
    (tmp_path / "etc" / "secret.txt").write_text("not for the build\n")
    (tmp_path / "ca.pem").write_text("-----BEGIN CERTIFICATE-----\n")
    return tmp_path


def test_local_paths_become_loopback_urls_and_nothing_else_is_served(tree: Path) -> None:
    paths = bws.LocalPaths()
    paths.base = "http://127.0.0.1:1"
    assert paths.url(f"file://{tree}/pypi/simple") == "http://127.0.0.1:1/0/simple/"
    assert paths.url(str(tree / "wheels")) == "http://127.0.0.1:1/1/"
    assert paths.url(str(tree / "etc" / "constraints.txt")) == "http://127.0.0.1:1/2/constraints.txt"
    assert paths.url("https://index.invalid/simple") == "https://index.invalid/simple"
    assert paths.url("/no/such/dir") == "/no/such/dir"
    wheel = tree / "pypi" / "files" / "demo-1.0-py3-none-any.whl"
    assert paths.translate("/0/files/demo-1.0-py3-none-any.whl") == str(wheel)
    assert paths.translate("/2/constraints.txt") == str(tree / "etc" / "constraints.txt")
    assert paths.translate("/2/secret.txt") is None  # a file root publishes that one file
    assert paths.translate("/1/../../etc/secret.txt") is None
    assert paths.translate("/0/%2e%2e/%2e%2e/etc/secret.txt") is None
    assert paths.translate("/9/") is None and paths.translate("/x/") is None


def test_a_build_command_gets_the_secrets_and_can_fetch_through_the_urls(tree: Path) -> None:
    # The "build" is a Python one-liner: it reads the pip.conf secret it was given and fetches what pip
    # would, through the URLs in it, while the wrapper's server runs.
    fake_pip = tree / "fakepip"
    (fake_pip / "pip").mkdir(parents=True)
    (fake_pip / "pip" / "__init__.py").write_text("")
    (fake_pip / "pip" / "__main__.py").write_text(
        "print('''env_var:\n"
        f"  PIP_FIND_LINKS='{tree / 'wheels'}'\n"
        "global:\n  /etc/pip.conf, exists: True\n"
        f"    global.extra-index-url: file://{tree / 'pypi' / 'simple'}\n"
        f"    global.constraint: {tree / 'etc' / 'constraints.txt'}\n"
        f"    global.cert: {tree / 'ca.pem'}\n''')\n")
    build = (
        "import configparser, sys, urllib.request\n"
        "args = sys.argv[1:]\n"
        "src = {a.split(',')[0][3:]: a.split('src=')[1] for a in args[1::2]}\n"
        "assert args[0::2] == ['--secret', '--secret'], args\n"
        "conf = configparser.ConfigParser(); conf.read(src['pip.conf'])\n"
        "g = conf['global']\n"
        "assert g['cert'] == '/etc/pip-ca.crt' and open(src['pip-ca']).read().startswith('-----BEGIN')\n"
        "get = lambda u: urllib.request.urlopen(u, timeout=10).read()\n"
        "assert b'torch-2.13.0%2Bcpu' in get(g['find-links']) or b'torch-2.13.0+cpu' in get(g['find-links'])\n"
        "page = g['extra-index-url'] + 'demo/'\n"
        "assert get(page + '../../files/demo-1.0-py3-none-any.whl') == b'wheel'\n"
        "assert get(g['constraint']) == b'torch<=2.14.1\\n'\n"
        "print('fetched', g['find-links'])\n"
    )
    env = {"SETTINGS_PYTHON": sys.executable, "PYTHONPATH": str(fake_pip), "PATH": "/usr/bin:/bin"}
    result = subprocess.run([sys.executable, str(SCRIPT), sys.executable, "-c", build], capture_output=True,
                            text=True, timeout=60, env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "fetched http://127.0.0.1:" in result.stdout
    written = configparser.ConfigParser()
    written.read_string(result.stderr.split("pip.conf for the build:\n", 1)[1])
    assert "file://" not in written["global"]["extra-index-url"]


def test_the_wrapper_passes_on_the_build_commands_exit_status() -> None:
    result = subprocess.run([sys.executable, str(SCRIPT), sys.executable, "-c", "raise SystemExit(3)"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 3, result.stderr
