#!/usr/bin/python3
"""The Python client's example (client/python/examples/submit_and_follow.py) against a live traind
with bearer-token auth.

- traind starts on loopback with --tokens-file (user alice) besides the `local` token file.
- alice's token: the example submits a tiny job, prints its events and `job <id> SUCCEEDED`,
  exits 0; through the client library the job's owner is alice, its step
  is max_steps.
- the local token through --token-file works too (exit 0, SUCCEEDED).
- a wrong token: exit 3, stderr names UNAUTHENTICATED and says the token was refused, no traceback,
  and nothing was submitted.

  python_client_test.py TRAIND PYTHON_GEN_DIR CLIENT_PYTHON_DIR
"""
import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from traind_proc import Traind, temp_dir, tiny_spec, write_text  # noqa: E402


def main():
    traind_bin, gen_dir, client_dir = sys.argv[1], os.path.abspath(sys.argv[2]), os.path.abspath(sys.argv[3])
    example = os.path.join(client_dir, "examples", "submit_and_follow.py")
    if not os.path.exists(os.path.join(gen_dir, "traind", "v1", "job_service_pb2_grpc.py")):
        print(f"FAIL: no generated modules in {gen_dir} (build the traind_python_proto target)")
        return 1
    env = dict(os.environ, PYTHONPATH=gen_dir + os.pathsep + client_dir)
    env.pop("TRAIND_TOKEN", None)
    tmp = temp_dir("traind-pyclient-")
    tokens = os.path.join(tmp, "tokens")
    alice = "alice-token-0123456789abcdef"
    with open(tokens, "w") as f:
        f.write(f"# test users\nalice {alice}\n")
    os.chmod(tokens, 0o600)
    daemon = Traind(traind_bin, os.path.join(tmp, "state"), ["--tokens-file", tokens])
    failures = []

    def run(args, timeout=120):
        r = subprocess.run([sys.executable, example, "--addr", daemon.addr] + args, capture_output=True,
                           text=True, timeout=timeout, env=env)
        print(f"$ submit_and_follow.py {' '.join(args)}  -> exit {r.returncode}\n{r.stdout}{r.stderr}", flush=True)
        return r

    def check(cond, msg):
        if not cond:
            failures.append(msg)

    try:
        daemon.start()
        data = os.path.join(tmp, "data.txt")
        write_text(data, 60_000)
        spec = os.path.join(tmp, "py.yaml")
        with open(spec, "w") as f:
            f.write(tiny_spec("py-client", "data.txt", "runs/py", max_steps=12, logging_steps=4, eval_steps=6,
                              overwrite_output_dir=True))

        r = run(["--token", alice, spec])
        check(r.returncode == 0, f"alice: exit {r.returncode}, want 0")
        lines = r.stdout.splitlines()
        check(lines and lines[0].startswith("submitted "), "alice: first line is not `submitted <id>`")
        job_id = lines[0].split()[1] if lines and lines[0].startswith("submitted ") else "?"
        check(f"job {job_id} SUCCEEDED" in r.stdout, "alice: no `job <id> SUCCEEDED` line")
        check("state RUNNING" in r.stdout, "alice: the followed events have no RUNNING state")
        check("step 12/12" in r.stdout, "alice: the followed events do not reach step 12/12")
        check("eval step 6" in r.stdout, "alice: no eval event followed")
        check("steps 12, train_loss" in r.stdout, "alice: no summary line")
        check(os.path.isdir(os.path.join(tmp, "runs", "py")), "relative output_dir did not resolve against the spec's folder")

        # The library directly: the job is alice's, and the local user does not see it.
        sys.path[:0] = [gen_dir, client_dir]
        from traind_client import Client, TraindError, state_name
        with Client(daemon.addr, alice) as c:
            j = c.get(job_id)
            check(j.owner == "alice" and state_name(j.state) == "SUCCEEDED" and j.step == 12,
                  f"GetJob as alice: owner {j.owner} state {state_name(j.state)} step {j.step}")
        with Client(daemon.addr, daemon.token()) as c:
            try:
                c.get(job_id)
                failures.append("the local user can read alice's job")
            except TraindError as e:
                check(e.code == "NOT_FOUND", f"local user reading alice's job: {e.code}, want NOT_FOUND")

        token_file = os.path.join(daemon.state_dir, "token")
        r = run(["--token-file", token_file, "--quiet", spec])
        check(r.returncode == 0 and " SUCCEEDED" in r.stdout, f"local token file: exit {r.returncode}")

        r = run(["--token", "not-the-token", spec], timeout=60)
        check(r.returncode == 3, f"wrong token: exit {r.returncode}, want 3")
        check("UNAUTHENTICATED" in r.stderr and "refused the token" in r.stderr,
              "wrong token: stderr does not say UNAUTHENTICATED / refused the token")
        check("Traceback" not in r.stderr, "wrong token: a Python traceback instead of an error line")
        check("submitted" not in r.stdout, "wrong token: something was submitted")
        with Client(daemon.addr, alice) as c:
            check(len(c.list()) == 1, "alice should have exactly one job")
    except Exception as e:  # noqa: BLE001 -- report, then fail
        failures.append(f"{type(e).__name__}: {e}")
    finally:
        daemon.stop()
    if failures:
        print("\n".join("FAIL: " + f for f in failures))
        print(f"(left {tmp}; traind log in state/stderr.log)")
        return 1
    shutil.rmtree(tmp, ignore_errors=True)
    print("OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
