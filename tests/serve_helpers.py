"""A `vkspec serve` process for tests: started on a free loopback port,
waited for, and driven with the official openai client or raw httpx."""

import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, model_dir, log, *args, env=None, host="127.0.0.1", key="none"):
        import openai
        self.port = free_port()
        self.log = log
        # the draft-vocabulary counts go to a cache folder of the test's own
        cache = {"XDG_CACHE_HOME": str(Path(log).parent / "xdg-cache")}
        self.proc = subprocess.Popen([sys.executable, "-m", "vkspec.cli", "serve", str(model_dir),
                                      "--port", str(self.port), "--host", host, *args],
                                     stdout=subprocess.DEVNULL, stderr=open(log, "w"),
                                     env={**os.environ, **cache, **(env or {})})
        self.url = f"http://127.0.0.1:{self.port}"
        for _ in range(600):
            if self.proc.poll() is not None:
                raise RuntimeError(open(log).read())
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        else:
            raise RuntimeError(open(log).read())
        self.client = openai.OpenAI(base_url=self.url + "/v1", api_key=key, max_retries=0)

    def health(self):
        return httpx.get(self.url + "/health", timeout=5).json()

    def turns(self):
        return [tuple(map(int, m)) for m in
                re.findall(r"turn \d+: prompt (\d+) \(reused (\d+)\)", open(self.log).read())]

    def rss_peak_kb(self) -> int:
        """The process's peak resident memory (VmHWM)."""
        for line in open(f"/proc/{self.proc.pid}/status"):
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
        raise RuntimeError("no VmHWM")

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=30)


def plain_and_spec(model_dir, logs, backend):
    """A plain server and one that drafts every round (MTP, lookup where it
    matches), of one backend on the same model."""
    plain = Server(model_dir, logs / "plain.log", "--backend", backend, "--spec", "off")
    spec = Server(model_dir, logs / "spec.log", "--backend", backend, "--spec", "auto", "--no-gate", "--drafts", "4")
    return plain, spec
