"""Load test (a script): 8 concurrent streaming clients against `vkspec serve`
on loopback, each answer checked against the single-client answer; while
they run, the disturbances arrive: a 10 MB body (Content-Length, then
chunked), the DELETE of a pin, and two clients that hang up (one streaming,
one not). Every answer must still equal the single-client answer, every
disturbance must get its own answer (413, 200, a cancelled turn), and the
server must stay up. Reports requests/s and p50/p99 latency (whole turn and
first chunk).

    .venv/bin/python tests/bench/load_serve.py [--backend cpu|vulkan] [--seconds 60] [--spec auto]
        [--threads N] [--no-disturb]

tests/test_serve_limits.py runs run_load() for a few seconds on its own server.
"""

import argparse
import json
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

PROMPTS = [("def f(x):\n    return x + %d\n" % i) * 3 for i in range(64)]


def run_load(url, model, seconds=60.0, clients=8, tokens=32, disturb=True) -> dict:
    """Drive a running server; returns the numbers and what went wrong."""
    client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=300)
    prompts = PROMPTS[:clients]

    def turn(p):
        t0 = time.perf_counter()
        first, text = None, ""
        for ch in client.completions.create(model=model, prompt=p, max_tokens=tokens, temperature=0, stream=True):
            if first is None:
                first = time.perf_counter() - t0
            text += ch.choices[0].text if ch.choices else ""
        return text, first, time.perf_counter() - t0

    alone = [turn(p)[0] for p in prompts]
    pin = httpx.post(url + "/v1/pins", json={"name": "load-pin", "prompt": prompts[0]}, timeout=300)
    problems = [] if pin.status_code == 200 else [f"pin: {pin.status_code} {pin.text}"]
    cancelled0 = httpx.get(url + "/health").json()["cancelled"]
    lat, ttft, bad = [], [], []
    stop = time.time() + seconds

    def run(i):
        try:
            while time.time() < stop:
                text, first, total = turn(prompts[i])
                lat.append(total)
                ttft.append(first)
                if text != alone[i]:
                    bad.append(i)
        except Exception as e:                          # noqa: BLE001 - reported
            problems.append(f"client {i}: {e!r}")

    disturbances = {}

    def disturber():
        time.sleep(min(seconds / 3, 2.0))
        body = b'{"model": "x", "prompt": "' + b"a" * (10 << 20) + b'"}'
        hdr = {"content-type": "application/json"}
        disturbances["10 MB body"] = httpx.post(url + "/v1/completions", content=body, headers=hdr,
                                                timeout=120).status_code

        def chunks():
            for i in range(0, len(body), 1 << 20):
                yield body[i:i + 1 << 20]
        disturbances["10 MB chunked body"] = httpx.post(url + "/v1/completions", content=chunks(), headers=hdr,
                                                        timeout=120).status_code
        disturbances["DELETE pin"] = httpx.delete(url + "/v1/pins/load-pin", timeout=120).status_code
        with httpx.stream("POST", url + "/v1/completions", headers=hdr, timeout=120,
                          content=json.dumps({"model": model, "prompt": "class Q:\n", "max_tokens": 1000,
                                              "stream": True, "temperature": 0})) as r:
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    break                               # the streaming client hangs up at its first frame
        disturbances["streaming hang-up"] = "sent"
        try:
            # 1000 tokens take ~1 s on the CPU path at best (20 x the time it waits)
            httpx.post(url + "/v1/completions", headers=hdr, timeout=httpx.Timeout(120, read=0.05),
                       content=json.dumps({"model": model, "prompt": "class R:\n", "max_tokens": 1000,
                                           "temperature": 0}))
            disturbances["non-streaming hang-up"] = "answered before it hung up"
        except httpx.ReadTimeout:
            disturbances["non-streaming hang-up"] = "sent"

    t0 = time.perf_counter()
    threads = [threading.Thread(target=run, args=(i,)) for i in range(clients)]
    if disturb:
        threads.append(threading.Thread(target=disturber))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    if disturb:
        want = {"10 MB body": 413, "10 MB chunked body": 413, "DELETE pin": 200, "streaming hang-up": "sent",
                "non-streaming hang-up": "sent"}
        for k, v in want.items():
            if disturbances.get(k) != v:
                problems.append(f"{k}: got {disturbances.get(k)!r}, want {v!r}")
        for _ in range(600):                            # the hang-ups end their turns at the next round
            if httpx.get(url + "/health").json()["cancelled"] >= cancelled0 + 2:
                break
            time.sleep(0.1)
        disturbances["cancelled turns"] = httpx.get(url + "/health").json()["cancelled"] - cancelled0
        if disturbances["cancelled turns"] != 2:
            problems.append(f"cancelled turns: {disturbances['cancelled turns']}, want 2")
    q = statistics.quantiles(lat, n=100) if len(lat) > 1 else [lat[0]] * 99
    f = statistics.quantiles(ttft, n=100) if len(ttft) > 1 else [ttft[0]] * 99
    return dict(requests=len(lat), wall_s=wall, req_per_s=len(lat) / wall, p50_ms=q[49] * 1e3, p99_ms=q[98] * 1e3,
                first_p50_ms=f[49] * 1e3, first_p99_ms=f[98] * 1e3, differing=len(bad), problems=problems,
                disturbances=disturbances)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", default="cpu")
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--spec", default="auto")
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=None, help="NUMBA_NUM_THREADS for the server")
    ap.add_argument("--no-disturb", action="store_true")
    a = ap.parse_args()
    from vkspec.tiny import make_tiny
    tmp = tempfile.mkdtemp()
    d = make_tiny(os.path.join(tmp, "echo0"), seed=6, mtp=True, echo=True)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "XDG_CACHE_HOME": os.path.join(tmp, "cache")}
    if a.threads:
        env["NUMBA_NUM_THREADS"] = str(a.threads)
    proc = subprocess.Popen([sys.executable, "-m", "vkspec.cli", "serve", str(d), "--port", str(port),
                             "--backend", a.backend, "--spec", a.spec], stderr=subprocess.DEVNULL, env=env)
    url = f"http://127.0.0.1:{port}"
    while True:
        try:
            if httpx.get(url + "/health").status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.2)
    try:
        r = run_load(url, "echo0", a.seconds, a.clients, a.tokens, disturb=not a.no_disturb)
    finally:
        proc.terminate()
        proc.wait()
    print(f"{a.backend} spec={a.spec} threads={a.threads or 'default'}: {a.clients} streaming clients, "
          f"{r['wall_s']:.0f} s, {r['requests']} requests ({r['req_per_s']:.2f} req/s), {a.tokens} tokens each; "
          f"latency p50 {r['p50_ms']:.0f} ms p99 {r['p99_ms']:.0f} ms; first chunk p50 {r['first_p50_ms']:.0f} ms "
          f"p99 {r['first_p99_ms']:.0f} ms; answers differing from the single-client answer: {r['differing']}")
    if r["disturbances"]:
        print("disturbances: " + ", ".join(f"{k} -> {v}" for k, v in r["disturbances"].items()))
    for p in r["problems"]:
        print("PROBLEM:", p)
    sys.exit(1 if r["differing"] or r["problems"] else 0)


if __name__ == "__main__":
    main()
