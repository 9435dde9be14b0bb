"""Load test (a script): 8 concurrent streaming clients for 60 s against
`vkspec serve` on loopback, each answer checked against the single-client
answer; reports requests/s and p50/p99 latency (first byte and whole turn).

    .venv/bin/python tests/bench/load_serve.py [--backend cpu|vulkan] [--seconds 60] [--spec auto]
"""

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import httpx
import openai

from vkspec.tiny import make_tiny


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", default="cpu")
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--spec", default="auto")
    ap.add_argument("--tokens", type=int, default=32)
    a = ap.parse_args()
    d = make_tiny(tempfile.mkdtemp(), seed=6, mtp=True, echo=True)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "vkspec.cli", "serve", str(d), "--port", str(port),
                             "--backend", a.backend, "--spec", a.spec], stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    while True:
        try:
            if httpx.get(url + "/health").status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.2)
    client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
    prompts = [("def f(x):\n    return x + %d\n" % i) * 3 for i in range(a.clients)]

    def turn(p):
        t0 = time.perf_counter()
        first, text = None, ""
        for ch in client.completions.create(model=os.path.basename(d), prompt=p, max_tokens=a.tokens,
                                            temperature=0, stream=True):
            if first is None:
                first = time.perf_counter() - t0
            text += ch.choices[0].text if ch.choices else ""
        return text, first, time.perf_counter() - t0

    alone = [turn(p)[0] for p in prompts]
    lat, ttft, bad = [], [], []
    stop = time.time() + a.seconds

    def run(i):
        while time.time() < stop:
            text, first, total = turn(prompts[i])
            lat.append(total)
            ttft.append(first)
            if text != alone[i]:
                bad.append(i)
    t0 = time.perf_counter()
    threads = [threading.Thread(target=run, args=(i,)) for i in range(a.clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    proc.terminate()
    proc.wait()
    q = statistics.quantiles(lat, n=100)
    f = statistics.quantiles(ttft, n=100)
    print(f"{a.backend} spec={a.spec}: {a.clients} streaming clients, {wall:.0f} s, {len(lat)} requests "
          f"({len(lat) / wall:.2f} req/s), {a.tokens} tokens each; latency p50 {q[49] * 1e3:.0f} ms "
          f"p99 {q[98] * 1e3:.0f} ms; first chunk p50 {f[49] * 1e3:.0f} ms p99 {f[98] * 1e3:.0f} ms; "
          f"answers differing from the single-client answer: {len(bad)}")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
