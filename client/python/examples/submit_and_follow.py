#!/usr/bin/python3
"""Submit a job spec to traind, follow its progress, print the final status.

  PYTHONPATH=build/python:client/python /usr/bin/python3 client/python/examples/submit_and_follow.py \
      --addr 127.0.0.1:50051 --state-dir .traind examples/tiny.yaml

Token as trainctl: --token, --token-file, $TRAIND_TOKEN, <--state-dir>/token.
Exit codes as trainctl: 0 job SUCCEEDED; 1 FAILED or CANCELLED; 2 invalid spec / unknown job;
3 traind unreachable or token refused.
"""
import argparse
import math
import sys

from traind_client import Client, TraindError, is_terminal, resolve_token, state_name


def describe(ev):
    kind = ev.WhichOneof("kind")
    if kind == "state":
        s = ev.state
        line = f"state {state_name(s.state)}"
        if s.attempt:
            line += f" (attempt {s.attempt})"
        if s.reason:
            line += f": {s.reason}"
        if s.error:
            line += f": {s.error}"
        return line
    if kind == "step":
        s = ev.step
        return (f"step {s.step}/{s.max_steps} loss {s.loss:.4f} lr {s.learning_rate:.3g} "
                f"grad_norm {s.grad_norm:.3g} {s.step_seconds * 1000:.1f} ms")
    if kind == "log":
        s = ev.log
        return f"log step {s.step} loss {s.loss:.4f} {s.tokens_per_second:.0f} tokens/s"
    if kind == "eval":
        return f"eval step {ev.eval.step} eval_loss {ev.eval.eval_loss:.4f}"
    if kind == "checkpoint":
        return f"checkpoint step {ev.checkpoint.step} in {ev.checkpoint.dir}"
    if kind == "message":
        return ev.message
    if kind == "plan":
        p = ev.plan
        return f"plan micro_batch {p.micro_batch} x {p.gradient_accumulation_steps}, {p.precision}, {p.bytes.total} bytes"
    if kind == "tokenize":
        t = ev.tokenize
        return f"tokenize {t.file}: {t.bytes_done}/{t.bytes_total} bytes{' (done)' if t.done else ''}"
    return kind or "event"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("spec", help="job spec file (YAML or JSON)")
    ap.add_argument("--addr", default="127.0.0.1:50051")
    ap.add_argument("--token")
    ap.add_argument("--token-file")
    ap.add_argument("--state-dir", default=".traind")
    ap.add_argument("--tls", action="store_true")
    ap.add_argument("--tls-ca")
    ap.add_argument("--quiet", action="store_true", help="print only the id and the final status")
    a = ap.parse_args()
    try:
        token = resolve_token(a.token, a.token_file, a.state_dir)
        with Client(a.addr, token, tls=a.tls, ca_file=a.tls_ca) as c:
            job = c.submit_file(a.spec)
            print(f"submitted {job.id} ({job.name})", flush=True)
            for ev in c.watch(job.id, follow=True):
                kind = ev.WhichOneof("kind")
                if not a.quiet or kind == "state":
                    print(f"[{ev.sequence}] {describe(ev)}", flush=True)
                if kind == "state" and is_terminal(ev.state.state):
                    break
            job = c.get(job.id)
            print(f"job {job.id} {state_name(job.state)}", flush=True)
            if job.HasField("summary"):
                s = job.summary
                ev_loss = "n/a" if math.isnan(s.eval_loss) else f"{s.eval_loss:.4f}"
                print(f"  steps {s.global_step}, train_loss {s.train_loss:.4f}, eval_loss {ev_loss}, "
                      f"{s.train_tokens_per_second:.0f} tokens/s, {s.train_runtime:.1f} s, model in {s.output_dir}")
            if job.error:
                print(f"  error: {job.error}")
            return 0 if state_name(job.state) == "SUCCEEDED" else 1
    except TraindError as e:
        print(f"error: {e}", file=sys.stderr)
        if e.code in ("UNAUTHENTICATED", "UNAVAILABLE", "PERMISSION_DENIED", "DEADLINE_EXCEEDED"):
            return 3
        return 2
    except OSError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
