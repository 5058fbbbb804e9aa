"""Helpers for the deploy tests: start the real traind on loopback (ports from
<state-dir>/ports.json, like tests/daemon/daemon_fixture.cc), write tiny text data and job specs."""
import json
import os
import random
import signal
import subprocess
import tempfile
import time
import urllib.request

WORDS = ("the of and to in is was that for on as with by he at from his an were are which this be "
         "or had not but what all when there can we one so out if has more about up time into them "
         "king queen lord love night day death life heart hand sweet blood fair").split()


def write_text(path, nbytes=200_000, seed=7):
    rng = random.Random(seed)
    out, n = [], 0
    while n < nbytes:
        line = " ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 14))).capitalize() + ".\n"
        out.append(line)
        n += len(line)
    with open(path, "w") as f:
        f.write("".join(out))


def tiny_spec(name, train_file, output_dir, max_steps=20, batch=4, seq_len=32, n_embd=32, n_layer=2,
              logging_steps=5, eval_steps=0, validation_split=0.05, overwrite_output_dir=False):
    s = (f"name: {name}\n"
         f"model:\n  arch: gpt2\n  config: {{vocab_size: 256, n_positions: {seq_len}, n_embd: {n_embd}, "
         f"n_layer: {n_layer}, n_head: 2}}\n"
         f"data:\n  train_file: {train_file}\n  seq_len: {seq_len}\n  validation_split: {validation_split}\n"
         f"training:\n  max_steps: {max_steps}\n  per_device_train_batch_size: {batch}\n"
         f"  logging_steps: {logging_steps}\n  save_steps: 0\n  learning_rate: 1.0e-3\n")
    if eval_steps:
        s += f"  eval_steps: {eval_steps}\n"
    if overwrite_output_dir:  # the same spec submitted again replaces the earlier run's results
        s += "  overwrite_output_dir: true\n"
    return s + f"output_dir: {output_dir}\n"


class Traind:
    def __init__(self, binary, state_dir, extra=()):
        self.binary, self.state_dir, self.extra = binary, state_dir, list(extra)
        self.proc = None
        self.grpc_port = self.metrics_port = 0

    def start(self, timeout=20.0):
        ports = os.path.join(self.state_dir, "ports.json")
        os.makedirs(self.state_dir, mode=0o700, exist_ok=True)
        if os.path.exists(ports):
            os.unlink(ports)
        self.log_path = os.path.join(self.state_dir, "stderr.log")
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen([self.binary, "--state-dir", self.state_dir, "--listen", "127.0.0.1:0",
                                      "--metrics-listen", "127.0.0.1:0"] + self.extra,
                                     stdout=log, stderr=log)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                break
            try:
                with open(ports) as f:
                    j = json.load(f)
                if j.get("pid") == self.proc.pid:
                    self.grpc_port, self.metrics_port = j["grpc"], j["metrics"]
                    return
            except (OSError, ValueError):
                pass
            time.sleep(0.05)
        raise RuntimeError("traind did not start; its log:\n" + open(self.log_path).read())

    @property
    def addr(self):
        return f"127.0.0.1:{self.grpc_port}"

    def token(self):
        with open(os.path.join(self.state_dir, "token")) as f:
            return f.read().strip()

    def scrape(self):
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as r:
            return r.read().decode()

    def stop(self, timeout=30.0):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def temp_dir(prefix):
    return tempfile.mkdtemp(prefix=prefix, dir=os.environ.get("TMPDIR", "/tmp"))
