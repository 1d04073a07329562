"""Starts and stops the qflash-server binary for the Python client tests (demo pair, CPU).

Each test script takes --server PATH (the binary) and --out DIR (where artefacts go) and ends
with a line 'N passed, N failed'.
"""
import argparse
import os
import re
import socket
import subprocess
import sys
import threading
import time


def args():
    ap = argparse.ArgumentParser()
    ap.add_argument("--server", required=True, help="path to qflash-server")
    ap.add_argument("--out", default="test-artifacts", help="folder for artefacts (screenshots)")
    return ap.parse_args()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """qflash-server on the demo pair; `port` 0 lets it pick one (read from its log)."""

    def __init__(self, binary, port=0, extra=()):
        env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
        self.proc = subprocess.Popen([binary, "--device", "cpu", "--port", str(port), "--model-name", "demo", *extra],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
        self.log = []
        found = threading.Event()
        self.port = None

        def read():
            for line in self.proc.stderr:
                self.log.append(line)
                m = re.search(r"serving .* on http://[^:]+:(\d+)", line)
                if m:
                    self.port = int(m.group(1))
                    found.set()
            found.set()

        threading.Thread(target=read, daemon=True).start()
        if not found.wait(120) or self.port is None:
            self.stop()
            raise RuntimeError("qflash-server did not start:\n" + "".join(self.log))
        self.url = f"http://127.0.0.1:{self.port}"

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class Results:
    def __init__(self):
        self.passed = self.failed = 0

    def run(self, name, fn, *a):
        t0 = time.time()
        try:
            fn(*a)
            self.passed += 1
            print(f"[ OK ] {name} ({time.time() - t0:.1f} s)", flush=True)
        except Exception as e:  # a failed check or an unexpected error: both fail the test
            self.failed += 1
            print(f"[FAIL] {name}: {type(e).__name__}: {e}", flush=True)

    def finish(self):
        print(f"{self.passed} passed, {self.failed} failed", flush=True)
        sys.exit(1 if self.failed or not self.passed else 0)
