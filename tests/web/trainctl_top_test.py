#!/usr/bin/python3
"""`trainctl top` against a live traind: under tmux (Debian's tmux, a private server socket) the live
view shows a finished job's row (SUCCEEDED, step = max_steps) and a running job's row (RUNNING,
its step advancing between two captures, an ETA), and q ends it; with stdout not a terminal it
prints one frame and exits 0; -o json prints one object with the rows; a wrong token exits 3.

  trainctl_top_test.py TRAIND TRAINCTL DEPLOY_TESTS_DIR
"""
import json
import os
import re
import shutil
import subprocess
import sys
import time

FINISHED_STEPS = 20


def main():
    traind_bin, trainctl, deploy_tests = sys.argv[1:4]
    sys.path.insert(0, deploy_tests)
    from traind_proc import Traind, temp_dir, tiny_spec, write_text  # noqa: E402

    tmux = shutil.which("tmux")
    if not tmux:
        print("FAIL: tmux is not installed (Debian package tmux; ./run.sh deps installs it)")
        return 1
    tmp = temp_dir("traind-top-")
    state = os.path.join(tmp, "state")
    daemon = Traind(traind_bin, state, ["--http-listen", "off"])
    sock = "traind-top-test-" + str(os.getpid())
    failures = []

    def check(cond, msg):
        print(("ok   " if cond else "FAIL ") + msg, flush=True)
        if not cond:
            failures.append(msg)

    def tm(*args, **kw):
        return subprocess.run([tmux, "-L", sock, "-f", "/dev/null"] + list(args), capture_output=True, text=True,
                              timeout=20, **kw)

    try:
        daemon.start()
        ctl = [trainctl, "--addr", daemon.addr, "--state-dir", state]
        data = os.path.join(tmp, "data.txt")
        write_text(data, 60_000)
        done_spec = os.path.join(tmp, "done.yaml")
        with open(done_spec, "w") as f:
            f.write(tiny_spec("top-done", data, os.path.join(tmp, "runs", "done"), max_steps=FINISHED_STEPS,
                              logging_steps=5))
        r = subprocess.run(ctl + ["submit", done_spec, "--wait"], capture_output=True, text=True, timeout=300)
        check(r.returncode == 0, f"the first job finishes (exit {r.returncode}) {r.stderr.strip()}")
        done_id = r.stdout.split()[0]
        long_spec = os.path.join(tmp, "long.yaml")
        with open(long_spec, "w") as f:
            f.write(tiny_spec("top-long", data, os.path.join(tmp, "runs", "long"), max_steps=200000,
                              logging_steps=10, n_embd=64))
        long_id = subprocess.run(ctl + ["submit", long_spec], capture_output=True, text=True, timeout=60).stdout.strip()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            j = json.loads(subprocess.run(ctl + ["-o", "json", "status", long_id], capture_output=True, text=True).stdout)
            if j["state"] == "RUNNING" and j["step"] > 10:
                break
            time.sleep(0.2)

        # One frame when stdout is not a terminal.
        r = subprocess.run(ctl + ["top"], capture_output=True, text=True, timeout=30)
        check(r.returncode == 0, f"top with stdout a pipe exits {r.returncode} (want 0): {r.stderr.strip()}")
        row = next((line for line in r.stdout.splitlines() if line.startswith(done_id)), "")
        check(bool(re.search(rf"{done_id}\s+top-done\s+local\s+SUCCEEDED\s+{FINISHED_STEPS}/{FINISHED_STEPS}\s+\d+\.\d{{4}}\s+\d+\s+-$", row)),
              f"the one frame has the finished row: {row!r}")
        check("ID" in r.stdout and "TOK/S" in r.stdout and "ETA" in r.stdout and "q quits" not in r.stdout,
              "the frame has the header and no key hint")
        r = subprocess.run(ctl + ["-o", "json", "top"], capture_output=True, text=True, timeout=30)
        rows = {j["id"]: j for j in json.loads(r.stdout)["jobs"]} if r.returncode == 0 else {}
        check(rows.get(done_id, {}).get("state") == "SUCCEEDED" and rows[done_id]["step"] == FINISHED_STEPS,
              f"-o json top has the finished job: {rows.get(done_id)}")
        check(rows.get(long_id, {}).get("state") == "RUNNING" and (rows[long_id].get("eta_seconds") or 0) > 0,
              f"-o json top has the running job with an ETA: {rows.get(long_id)}")
        r = subprocess.run([trainctl, "--addr", daemon.addr, "--token", "wrong", "top"], capture_output=True,
                           text=True, timeout=30)
        check(r.returncode == 3 and "token" in r.stderr, f"a wrong token: exit {r.returncode} {r.stderr.strip()!r}")

        # The live view under tmux.
        cmd = " ".join(ctl + ["top", "--interval", "0.5"])
        r = tm("new-session", "-d", "-s", "top", "-x", "150", "-y", "30", cmd)
        check(r.returncode == 0, f"tmux new-session: {r.returncode} {r.stderr.strip()}")

        def capture():
            return tm("capture-pane", "-p", "-t", "top").stdout

        def running_step(text):
            m = re.search(rf"^{long_id}\s+top-long\s+local\s+RUNNING\s+(\d+)/200000\s+\d+\.\d{{4}}\s+\d+\s+[\d:]+$",
                          text, re.M)
            return int(m.group(1)) if m else None

        deadline, screen = time.monotonic() + 30, ""
        while time.monotonic() < deadline:
            screen = capture()
            if done_id in screen and running_step(screen) is not None:
                break
            time.sleep(0.25)
        print(screen)
        check(bool(re.search(rf"^{done_id}\s+top-done\s+local\s+SUCCEEDED\s+{FINISHED_STEPS}/{FINISHED_STEPS}\s", screen, re.M)),
              "capture-pane holds the finished job's row")
        first = running_step(screen)
        check(first is not None, f"capture-pane holds the running job's row with loss, tokens/s and an ETA")
        check("(q quits)" in screen, "the live view shows the key hint")
        time.sleep(2.0)
        later = running_step(capture())
        check(first is not None and later is not None and later > first,
              f"the view refreshes: step {first} then {later}")
        tm("send-keys", "-t", "top", "q")
        deadline, alive = time.monotonic() + 10, True
        while time.monotonic() < deadline and alive:
            alive = tm("has-session", "-t", "top").returncode == 0
            time.sleep(0.2)
        check(not alive, "q quits trainctl top (the tmux session ends)")
        subprocess.run(ctl + ["cancel", long_id], capture_output=True, timeout=30)
    except Exception as e:  # noqa: BLE001
        failures.append(f"exception: {e!r}")
        print(f"FAIL exception: {e!r}", flush=True)
    finally:
        tm("kill-server")
        daemon.stop()
    if failures:
        print(f"{len(failures)} failure(s); traind log: {daemon.log_path}")
        return 1
    shutil.rmtree(tmp, ignore_errors=True)
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
