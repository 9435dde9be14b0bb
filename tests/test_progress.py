"""Where a user waits: loading shows a progress bar on a terminal and
nothing otherwise; `vkspec serve` says when it is ready and where."""

import fcntl
import os
import pty
import re
import select
import socket
import struct
import subprocess
import sys
import termios
import time

import httpx
import pytest

from vkspec.tiny import make_tiny

RUN = ["run", "--prompt-ids", "5,9,14,200", "-n", "4", "--backend", "vulkan", "--spec", "mtp"]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return make_tiny(tmp_path_factory.mktemp("progress") / "tiny", seed=4, mtp=True)


def env(tmp_path):
    e = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "xdg")}
    e.pop("VKSPEC_PROGRESS", None)
    return e


def test_no_progress_bar_when_stderr_is_not_a_terminal(vk, tiny_dir, tmp_path):
    r = subprocess.run([sys.executable, "-m", "vkspec.cli", RUN[0], str(tiny_dir), *RUN[1:]], capture_output=True,
                       text=True, timeout=600, env=env(tmp_path))
    assert r.returncode == 0, r.stderr
    assert "uploading weights" not in r.stderr and "recording pipelines" not in r.stderr and "\r" not in r.stderr


def test_progress_bars_on_a_terminal(vk, tiny_dir, tmp_path):
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))   # a terminal has a width
    p = subprocess.Popen([sys.executable, "-m", "vkspec.cli", RUN[0], str(tiny_dir), *RUN[1:]],
                         stdout=subprocess.DEVNULL, stderr=slave, env=env(tmp_path))
    os.close(slave)
    seen = b""
    while True:
        ready, _, _ = select.select([master], [], [], 1.0)
        if ready:
            try:
                chunk = os.read(master, 65536)
            except OSError:                     # the child closed its end
                break
            if not chunk:
                break
            seen += chunk
        elif p.poll() is not None:
            break
    os.close(master)
    assert p.wait(timeout=600) == 0, seen.decode(errors="replace")
    text = seen.decode(errors="replace")
    assert "uploading weights" in text and "recording pipelines" in text


def test_serve_says_when_it_is_ready_and_where(tiny_dir, tmp_path):
    p = subprocess.Popen([sys.executable, "-m", "vkspec.cli", "serve", str(tiny_dir), "--port", "0"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env(tmp_path))
    try:
        deadline, line = time.monotonic() + 300, ""
        while time.monotonic() < deadline:
            line = p.stderr.readline()
            if not line or "ready:" in line:
                break
        m = re.search(r"\[vkspec serve\] ready: tiny on (http://127\.0\.0\.1:(\d+)) \(cpu, f32, q8 activations, spec auto\)", line)
        assert m, line
        assert int(m.group(2)) > 0
        assert httpx.get(m.group(1) + "/health", timeout=10).status_code == 200   # ready means ready
    finally:
        p.terminate()
        p.wait(timeout=30)


def test_serve_on_a_port_in_use_is_one_line(tiny_dir, tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        r = subprocess.run([sys.executable, "-m", "vkspec.cli", "serve", str(tiny_dir), "--port", str(port)],
                           capture_output=True, text=True, timeout=120, env=env(tmp_path))
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1 and r.stderr.startswith(f"vkspec: cannot listen on 127.0.0.1:{port}")
