#!/usr/bin/env python3
"""8 clients for 20 s against one qflash-server with a short queue (--queue 2): every request
is answered (200 with a whole reply or a whole stream) or cleanly refused (429 with Retry-After
and an OpenAI error body); nothing hangs, the server stays up and /health answers throughout."""
import http.client
import json
import random
import threading
import time

import pyserver

CLIENTS, SECONDS = 8, 20.0


def one_request(port, rng):
    kind = rng.choice(["completion", "stream", "chat"])
    body = {"max_tokens": rng.randint(4, 16)}
    path = "/v1/completions"
    if kind == "chat":
        path = "/v1/chat/completions"
        body["messages"] = [{"role": "user", "content": rng.choice(["import os", "def f(x):", "class A:"])}]
        body["chat_template_kwargs"] = {"enable_thinking": False}
    else:
        body["prompt"] = rng.choice(["def parse_args(", "import sys\n", "for i in range("])
        body["stream"] = kind == "stream"
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    r = conn.getresponse()
    data = r.read().decode()
    conn.close()
    if r.status == 429:
        assert int(r.getheader("Retry-After")) >= 1
        assert json.loads(data)["error"]["type"] == "rate_limit_error", data
        return "429"
    assert r.status == 200, (r.status, data[:300])
    if kind == "stream":
        assert data.rstrip().endswith("data: [DONE]"), data[-200:]
        events = [json.loads(l[6:]) for l in data.split("\n\n") if l.startswith("data: {")]
        assert events[-1]["choices"][0]["finish_reason"] in ("stop", "length"), events[-1]
    else:
        j = json.loads(data)
        assert j["choices"][0]["finish_reason"] in ("stop", "length"), j
    return "200"


def main():
    a = pyserver.args()
    srv = pyserver.Server(a.server, extra=["--queue", "2"])
    res = pyserver.Results()
    counts, errors, lock = {"200": 0, "429": 0}, [], threading.Lock()
    health_worst = [0.0]
    end = time.time() + SECONDS

    def client(i):
        rng = random.Random(i)
        while time.time() < end:
            try:
                k = one_request(srv.port, rng)
                with lock:
                    counts[k] += 1
                if k == "429":
                    time.sleep(0.2)
            except Exception as e:  # any other outcome is a failure of the test
                with lock:
                    errors.append(f"client {i}: {type(e).__name__}: {e}")

    def health():
        while time.time() < end:
            t0 = time.time()
            conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=5)
            conn.request("GET", "/health")
            assert conn.getresponse().status == 200
            conn.close()
            health_worst[0] = max(health_worst[0], time.time() - t0)
            time.sleep(0.5)

    def load():
        threads = [threading.Thread(target=client, args=(i,)) for i in range(CLIENTS)]
        for t in threads:
            t.start()
        health()
        for t in threads:
            t.join(120)
        assert not any(t.is_alive() for t in threads), "a client hung"
        print(f"  answered {counts['200']}, refused {counts['429']}, /health worst {health_worst[0] * 1000:.0f} ms")
        assert not errors, errors[:5]
        assert counts["200"] >= CLIENTS, counts
        assert counts["429"] > 0, "the queue never filled: the test did not load the server"
        assert health_worst[0] < 2.0, health_worst[0]
        assert srv.proc.poll() is None, "the server died"

    try:
        res.run("eight_clients_twenty_seconds", load)
    finally:
        srv.stop()
    res.finish()


if __name__ == "__main__":
    main()
