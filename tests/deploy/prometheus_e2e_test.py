#!/usr/bin/python3
"""End-to-end check of deploy/: a real Prometheus scrapes a real traind while it trains, and every
PromQL expression of the Grafana dashboard and of the alert rules is evaluated through
Prometheus' HTTP API (/api/v1/query).

- traind starts on loopback (temp state dir, ports from ports.json), trainctl submits a tiny gpt2
  job on a text file the test writes (eval every 5 steps, long max_steps; cancelled at the end).
- Prometheus (Debian's `prometheus`; missing = failure, ./run.sh installs it) runs with
  deploy/prometheus.yml as the base config (its scrape job `traind`, its rule_files), rewritten for
  the test: scrape and evaluation interval 1s, target = traind's metrics port, temp storage.
- Dashboard: each target expr is evaluated twice, with $job/$instance = `.*` and with the real job
  name / target address (regex-escaped); $__rate_interval = 30s. Each must return a non-empty
  result, except those on series only a data-parallel rank has (traind_comm_*: valid is enough). The template variables' label_values() selectors must find series carrying the label.
  A few exprs must be positive (throughput, loss, step time p50, memory capacity, gRPC rate).
- Alert rules. The rule: each expr must be valid as written (status success; it is a condition,
  so it is normally empty), and its comparisons turned into `bool` comparisons (`A > 0.9` ->
  `A > bool 0.9`, which keeps every series the condition looks at, 0 or 1) must return a
  non-empty result. /api/v1/rules must list every rule with health "ok".

  prometheus_e2e_test.py TRAIND TRAINCTL DEPLOY_DIR
"""
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request

import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from traind_proc import Traind, temp_dir, tiny_spec, write_text  # noqa: E402

T0 = time.monotonic()


def log(msg):
    print(f"[{time.monotonic() - T0:5.1f}s] {msg}", flush=True)


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


class Prom:
    def __init__(self, port):
        self.base = f"http://127.0.0.1:{port}"

    def get(self, path, **params):
        url = self.base + path + ("?" + urllib.parse.urlencode(params, doseq=True) if params else "")
        try:
            with urllib.request.urlopen(url, timeout=10) as r:
                return json.loads(r.read())
        except urllib.error.HTTPError as e:  # 400 for a bad query: the body says why
            return json.loads(e.read())

    def query(self, q):
        return self.get("/api/v1/query", query=q)


def to_bool_comparisons(expr):
    """Inserts `bool` after each comparison operator outside {...}, [...] and strings."""
    out, i, depth_c, depth_s, quote = [], 0, 0, 0, None
    while i < len(expr):
        ch = expr[i]
        if quote:
            out.append(ch)
            if ch == "\\":
                out.append(expr[i + 1])
                i += 1
            elif ch == quote:
                quote = None
            i += 1
            continue
        if ch in "\"'`":
            quote = ch
        elif ch == "{":
            depth_c += 1
        elif ch == "}":
            depth_c -= 1
        elif ch == "[":
            depth_s += 1
        elif ch == "]":
            depth_s -= 1
        elif depth_c == 0 and depth_s == 0:
            m = re.match(r"==|!=|>=|<=|>|<", expr[i:])
            if m:
                op = m.group(0)
                rest = expr[i + len(op):]
                out.append(op)
                if not re.match(r"\s*bool\b", rest):
                    out.append(" bool")
                i += len(op)
                continue
        out.append(ch)
        i += 1
    return "".join(out)


def substitute(expr, job, instance):
    return (expr.replace("$__rate_interval", "30s").replace("${__rate_interval}", "30s")
            .replace("$__interval", "5s").replace("${job}", job).replace("$job", job)
            .replace("${instance}", instance).replace("$instance", instance))


def wait_until(what, pred, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def result_values(res):
    vals = []
    for r in res.get("data", {}).get("result", []):
        try:
            vals.append(float(r["value"][1]))
        except (KeyError, ValueError, IndexError):
            pass
    return vals


def main():
    traind_bin, trainctl_bin, deploy = sys.argv[1], sys.argv[2], os.path.abspath(sys.argv[3])
    prom_bin = shutil.which("prometheus")
    if not prom_bin:
        print("FAIL: Debian's `prometheus` binary is not installed (./run.sh deps installs it: "
              "apt-get install prometheus)")
        return 1
    dash = json.load(open(os.path.join(deploy, "grafana", "traind.json")))
    rules = yaml.safe_load(open(os.path.join(deploy, "prometheus-rules.yml")))
    base_cfg = yaml.safe_load(open(os.path.join(deploy, "prometheus.yml")))

    tmp = temp_dir("traind-deploy-e2e-")
    daemon = Traind(traind_bin, os.path.join(tmp, "state"))
    prom_proc = None
    failures = []
    job_id = None
    try:
        daemon.start()
        log(f"traind up: grpc {daemon.addr}, metrics {daemon.metrics_port}")
        data = os.path.join(tmp, "data.txt")
        write_text(data)
        spec = os.path.join(tmp, "e2e.yaml")
        with open(spec, "w") as f:
            f.write(tiny_spec("e2e-dash", data, os.path.join(tmp, "runs", "e2e"), max_steps=1_000_000, batch=8,
                              seq_len=64, n_embd=64, logging_steps=2, eval_steps=5, validation_split=0.05))
        ctl = [trainctl_bin, "--addr", daemon.addr, "--state-dir", daemon.state_dir]
        r = subprocess.run(ctl + ["submit", spec], capture_output=True, text=True, timeout=60)
        if r.returncode != 0:
            raise AssertionError(f"trainctl submit failed ({r.returncode}): {r.stdout}{r.stderr}")
        job_id = r.stdout.strip().split()[-1]
        log(f"submitted {job_id}")

        # Prometheus: deploy/prometheus.yml, rewritten for the test.
        cfg = dict(base_cfg)
        cfg["global"] = dict(cfg.get("global", {}), scrape_interval="1s", evaluation_interval="1s")
        sc = [s for s in cfg["scrape_configs"] if s.get("job_name") == "traind"]
        if len(sc) != 1:
            raise AssertionError("deploy/prometheus.yml has no scrape job named traind")
        target = f"127.0.0.1:{daemon.metrics_port}"
        sc[0]["static_configs"] = [dict(sc[0]["static_configs"][0], targets=[target])]
        cfg["scrape_configs"] = sc
        cfg["rule_files"] = [os.path.join(deploy, f) for f in base_cfg.get("rule_files", [])]
        if not any(f.endswith("prometheus-rules.yml") for f in cfg["rule_files"]):
            raise AssertionError("deploy/prometheus.yml does not load prometheus-rules.yml")
        cfg_path = os.path.join(tmp, "prometheus.yml")
        with open(cfg_path, "w") as f:
            yaml.safe_dump(cfg, f)
        port = free_port()
        prom_log = open(os.path.join(tmp, "prometheus.log"), "wb")
        prom_proc = subprocess.Popen([prom_bin, f"--config.file={cfg_path}", f"--web.listen-address=127.0.0.1:{port}",
                                      f"--storage.tsdb.path={os.path.join(tmp, 'prom-data')}",
                                      "--storage.tsdb.retention.time=1h"], stdout=prom_log, stderr=prom_log)
        prom = Prom(port)

        def ready():
            if prom_proc.poll() is not None:
                raise AssertionError("prometheus exited:\n" + open(os.path.join(tmp, "prometheus.log")).read()[-3000:])
            try:
                with urllib.request.urlopen(prom.base + "/-/ready", timeout=2) as resp:
                    return resp.status == 200
            except OSError:
                return False
        wait_until("Prometheus /-/ready", ready, 20)
        log("prometheus ready")
        wait_until("the traind target to be up", lambda: any(
            t.get("health") == "up" for t in prom.get("/api/v1/targets")["data"]["activeTargets"]), 30)
        log("target up")

        def enough():
            # Control-plane traffic (what a user's trainctl does), so the gRPC panel has a rate.
            subprocess.run(ctl + ["status", job_id], capture_output=True, timeout=30)
            n = result_values(prom.query(f'count_over_time(traind_train_steps_total{{job_id="{job_id}"}}[1m])'))
            ev = result_values(prom.query(f'traind_eval_loss{{job_id="{job_id}"}}'))
            tps = result_values(prom.query(f'traind_train_tokens_per_second{{job_id="{job_id}"}}'))
            return n and n[0] >= 6 and ev and ev[0] > 0 and tps and tps[0] > 0
        wait_until("6 scrapes of the running job with an eval loss and a throughput", enough, 40)
        log("job scraped while running")

        def rules_ok():
            groups = prom.get("/api/v1/rules")["data"]["groups"]
            got = {r["name"]: r for g in groups for r in g["rules"]}
            return got if all(got.get(r["alert"], {}).get("health") == "ok"
                              for g in rules["groups"] for r in g["rules"]) else None
        loaded = wait_until("every alert rule evaluated with health ok", rules_ok, 15)

        # --- dashboard ---
        variables = {v["name"]: v for v in dash["templating"]["list"]}
        # Values as Grafana writes them into a PromQL string: regex-escaped, backslashes doubled.
        instance_re = re.escape(target).replace("\\", "\\\\")
        job_re = re.escape("e2e-dash").replace("\\-", "-").replace("\\", "\\\\")
        n_dash = 0
        data_parallel_only = ("traind_comm_seconds_total", "traind_comm_hidden_seconds_total",
                              "traind_comm_bytes_total")
        must_be_positive = ("traind_train_tokens_per_second", "traind_train_loss{", "histogram_quantile(0.5",
                            "traind_device_memory_total_bytes", "traind_grpc_requests_total")
        for p in dash["panels"]:
            for t in p["targets"]:
                for job, inst in ((".*", ".*"), (job_re, instance_re)):
                    q = substitute(t["expr"], job, inst)
                    res = prom.query(q)
                    n_dash += 1
                    if res.get("status") != "success":
                        failures.append(f"dashboard '{p['title']}' {t['refId']}: {q}: {res.get('error')}")
                    elif not res["data"]["result"]:
                        # A rank of a data-parallel run alone has traind_comm_* series; this job trains
                        # alone, so those queries need only be valid (hosts_submit_test scrapes them).
                        if not any(m in t["expr"] for m in data_parallel_only):
                            failures.append(f"dashboard '{p['title']}' {t['refId']}: {q}: empty result")
                    elif any(m in t["expr"] for m in must_be_positive) and not any(v > 0 for v in result_values(res)):
                        failures.append(f"dashboard '{p['title']}' {t['refId']}: {q}: no positive value "
                                        f"({result_values(res)})")
        for name in ("instance", "job"):
            q = variables[name]["query"]
            q = q["query"] if isinstance(q, dict) else q
            m = re.fullmatch(r"label_values\((.*),\s*(\w+)\)", substitute(q, ".*", ".*"))
            if not m:
                failures.append(f"${name}: cannot parse {q}")
                continue
            series = prom.get("/api/v1/series", **{"match[]": m.group(1)}).get("data", [])
            values = {s.get(m.group(2)) for s in series}
            want = target if name == "instance" else "e2e-dash"
            if want not in values:
                failures.append(f"${name}: {q} gives {sorted(v for v in values if v)}, not {want}")
        log(f"dashboard: {n_dash} queries evaluated")

        # --- alert rules ---
        n_rules = 0
        for g in rules["groups"]:
            for r in g["rules"]:
                expr = r["expr"]
                res = prom.query(expr)
                if res.get("status") != "success":
                    failures.append(f"rule {r['alert']}: {expr}: {res.get('error')}")
                probe = to_bool_comparisons(expr)
                if probe == expr:
                    failures.append(f"rule {r['alert']}: {expr} has no comparison to probe")
                res = prom.query(probe)
                n_rules += 1
                if res.get("status") != "success":
                    failures.append(f"rule {r['alert']} probe {probe}: {res.get('error')}")
                elif not res["data"]["result"]:
                    failures.append(f"rule {r['alert']} probe {probe}: empty result")
                if loaded.get(r["alert"], {}).get("lastError"):
                    failures.append(f"rule {r['alert']}: Prometheus reports {loaded[r['alert']]['lastError']}")
        log(f"alert rules: {n_rules} probes evaluated")
    except AssertionError as e:
        failures.append(str(e))
    finally:
        if job_id and daemon.proc and daemon.proc.poll() is None:
            subprocess.run([trainctl_bin, "--addr", daemon.addr, "--state-dir", daemon.state_dir, "cancel", job_id],
                           capture_output=True, timeout=30)
        if prom_proc and prom_proc.poll() is None:
            prom_proc.terminate()
            try:
                prom_proc.wait(15)
            except subprocess.TimeoutExpired:
                prom_proc.kill()
        daemon.stop()
    if failures:
        print("\n".join("FAIL: " + f for f in failures))
        print(f"(left {tmp} for post-mortems: traind log state/stderr.log, prometheus.log)")
        return 1
    shutil.rmtree(tmp, ignore_errors=True)
    log("OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
