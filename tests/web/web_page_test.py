#!/usr/bin/python3
"""traind's web page (--http-listen) against a live traind with bearer-token auth.

- JSON endpoints (urllib): `GET /` needs no token; /api/jobs answers 401 without a token and with a
  wrong one, 200 with the right one; the list holds the finished job (state SUCCEEDED, step =
  max_steps, owner local, tokens/s > 0); its events hold one step event per step and the eval
  losses; another user (alice, from --tokens-file) sees no jobs and gets 404 for the job; a POST
  cancel stops a long job (CANCELLED).
- The page in headless Chromium, driven over the DevTools protocol (python3-websocket): a wrong
  token typed into the login form shows the login error and is not kept; the right token shows the
  job row with its state and a loss chart with one point per step; the token is in sessionStorage
  and in no URL. A screenshot is written to OUT_PNG (docs/web-page.png is a copy of one).
- A job submitted while the page is open appears, its loss curve grows while it runs, and the
  page's cancel button cancels it (the row says CANCELLED).
- HTTPS: a traind with --tls-cert/--tls-key serves the endpoints over TLS only (200 with the
  token, 401 with a wrong one; plaintext HTTP gets no answer).
- A given --http-listen address that is taken stops traind with the reason; a plaintext
  non-loopback one is refused (exit 2).

  web_page_test.py TRAIND TRAINCTL DEPLOY_TESTS_DIR OUT_PNG
"""
import base64
import http.client
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request

MAX_STEPS = 40


def main():
    traind_bin, trainctl, deploy_tests, out_png = sys.argv[1:5]
    sys.path.insert(0, deploy_tests)
    from traind_proc import Traind, temp_dir, tiny_spec, write_text  # noqa: E402

    chromium = shutil.which("chromium")
    if not chromium:
        print("FAIL: chromium is not installed (Debian package chromium; ./run.sh deps installs it)")
        return 1
    try:
        import websocket  # noqa: F401  (Debian python3-websocket)
    except ImportError:
        print("FAIL: python3-websocket is not installed (./run.sh deps installs it)")
        return 1

    tmp = temp_dir("traind-web-")
    tokens = os.path.join(tmp, "tokens")
    alice = "alice-token-web-0123456789"
    with open(tokens, "w") as f:
        f.write(f"alice {alice}\n")
    os.chmod(tokens, 0o600)
    state = os.path.join(tmp, "state")
    daemon = Traind(traind_bin, state, ["--http-listen", "127.0.0.1:0", "--tokens-file", tokens])
    failures = []

    def check(cond, msg):
        print(("ok   " if cond else "FAIL ") + msg, flush=True)
        if not cond:
            failures.append(msg)

    try:
        daemon.start()
        with open(os.path.join(state, "ports.json")) as f:
            http_port = json.load(f)["http"]
        check(http_port > 0, f"ports.json names the web page's port ({http_port})")
        base = f"http://127.0.0.1:{http_port}"
        token = daemon.token()

        def get(path, tok=None, method="GET"):
            req = urllib.request.Request(base + path, method=method)
            if tok is not None:
                req.add_header("Authorization", "Bearer " + tok)
            try:
                with urllib.request.urlopen(req, timeout=10) as r:
                    return r.status, r.read().decode()
            except urllib.error.HTTPError as e:
                return e.code, e.read().decode()

        write_text(os.path.join(tmp, "data.txt"), 80_000)
        spec = os.path.join(tmp, "web.yaml")
        with open(spec, "w") as f:
            f.write(tiny_spec("web-demo", os.path.join(tmp, "data.txt"), os.path.join(tmp, "runs", "web"),
                              max_steps=MAX_STEPS, logging_steps=5, eval_steps=10))
        ctl = [trainctl, "--addr", daemon.addr, "--state-dir", state]
        r = subprocess.run(ctl + ["submit", spec, "--wait"], capture_output=True, text=True, timeout=300)
        check(r.returncode == 0, f"trainctl submit --wait exit {r.returncode} (want 0) {r.stderr.strip()}")
        job_id = r.stdout.split()[0] if r.stdout.split() else ""

        # JSON endpoints.
        code, body = get("/")
        check(code == 200 and "<title>traind</title>" in body, f"GET / without a token: {code}, the page")
        check("cdn" not in body.lower() and "https://" not in body, "the page loads nothing from outside")
        code, body = get("/api/jobs")
        check(code == 401 and "error" in json.loads(body), f"GET /api/jobs without a token: {code} (want 401)")
        code, _ = get("/api/jobs", "not-the-token")
        check(code == 401, f"GET /api/jobs with a wrong token: {code} (want 401)")
        code, _ = get(f"/api/jobs/{job_id}/events", "not-the-token")
        check(code == 401, f"GET events with a wrong token: {code} (want 401)")
        code, body = get("/api/jobs", token)
        check(code == 200, f"GET /api/jobs with the token: {code} (want 200)")
        jobs = json.loads(body)["jobs"] if code == 200 else []
        row = next((j for j in jobs if j["id"] == job_id), None)
        check(row is not None, f"the job list holds {job_id}: {[j['id'] for j in jobs]}")
        if row:
            check(row["state"] == "SUCCEEDED", f"state {row['state']} (want SUCCEEDED)")
            check(row["step"] == MAX_STEPS and row["max_steps"] == MAX_STEPS, f"step {row['step']}/{row['max_steps']}")
            check(row["owner"] == "local" and row["name"] == "web-demo", f"owner {row['owner']}, name {row['name']}")
            check((row["tokens_per_second"] or 0) > 0, f"tokens/s {row['tokens_per_second']} > 0")
            check((row["mfu"] or 0) > 0, f"MFU {row['mfu']} > 0")
            check(row["created_unix_ms"] > 0 and row["started_unix_ms"] >= row["created_unix_ms"]
                  and row["finished_unix_ms"] >= row["started_unix_ms"], "submitted <= started <= finished")
        code, body = get(f"/api/jobs/{job_id}", token)
        detail = json.loads(body).get("job", {}) if code == 200 else {}
        check(code == 200 and "max_steps: 40" in detail.get("spec_yaml", ""), f"job detail {code} has the spec")
        check(bool(detail.get("plan")) and detail["plan"]["bytes"]["total"] > 0, "job detail has the plan")
        check(detail.get("memory_peak_bytes", 0) > 0, f"job detail has the measured peak {detail.get('memory_peak_bytes')}")
        code, body = get(f"/api/jobs/{job_id}/events?from=1", token)
        events = json.loads(body)["events"] if code == 200 else []
        steps = [e for e in events if e["type"] == "step"]
        evals = [e for e in events if e["type"] == "eval"]
        check(len(steps) == MAX_STEPS, f"{len(steps)} step events (want {MAX_STEPS})")
        check(len(evals) >= 3, f"{len(evals)} eval events (want >= 3)")
        code, body = get("/api/jobs", alice)
        check(code == 200 and json.loads(body)["jobs"] == [], f"alice sees no jobs: {code} {body[:80]}")
        code, _ = get(f"/api/jobs/{job_id}", alice)
        check(code == 404, f"alice gets 404 for local's job: {code}")
        code, _ = get(f"/api/jobs/{job_id}/cancel", alice, method="POST")
        check(code == 404, f"alice cannot cancel local's job: {code}")

        # Cancel through the endpoint: a long job, cancelled once it runs.
        long_spec = os.path.join(tmp, "long.yaml")
        with open(long_spec, "w") as f:
            f.write(tiny_spec("web-long", os.path.join(tmp, "data.txt"), os.path.join(tmp, "runs", "long"),
                              max_steps=100000, logging_steps=50))
        r = subprocess.run(ctl + ["submit", long_spec], capture_output=True, text=True, timeout=60)
        long_id = r.stdout.strip()
        code, _ = get(f"/api/jobs/{long_id}/cancel", token, method="POST")
        check(code == 200, f"POST cancel {long_id}: {code}")
        deadline, st = time.monotonic() + 60, ""
        while time.monotonic() < deadline:
            st = json.loads(get(f"/api/jobs/{long_id}", token)[1])["job"]["state"]
            if st == "CANCELLED":
                break
            time.sleep(0.3)
        check(st == "CANCELLED", f"the cancelled job ends CANCELLED ({st})")

        # The live job steps at a real job's pace (tens of steps/s here, not the 1000/s of the
        # tiny model), so a loaded CI machine's browser sees its curve grow between polls.
        live_spec = os.path.join(tmp, "live.yaml")
        with open(live_spec, "w") as f:
            f.write(tiny_spec("web-live", os.path.join(tmp, "data.txt"), os.path.join(tmp, "runs", "live"),
                              max_steps=100000, logging_steps=20, n_embd=128, n_layer=4, seq_len=128, batch=8))
        browser_checks(chromium, base, token, job_id, tmp, out_png, check, ctl + ["submit", live_spec])
        daemon.stop()
        tls_checks(Traind, tmp, check)
        flag_checks(traind_bin, tmp, check)
    except Exception as e:  # noqa: BLE001
        failures.append(f"exception: {e!r}")
        print(f"FAIL exception: {e!r}", flush=True)
    finally:
        daemon.stop()
    if failures:
        print(f"{len(failures)} failure(s); traind log: {daemon.log_path if daemon.proc else '-'}")
        return 1
    shutil.rmtree(tmp, ignore_errors=True)
    print("PASS")
    return 0


def tls_checks(Traind, tmp, check):
    """--tls-cert/--tls-key (the gRPC flags) make the web page HTTPS only, with the same tokens."""
    import ssl
    key, cert = os.path.join(tmp, "key.pem"), os.path.join(tmp, "cert.pem")
    r = subprocess.run(["/usr/bin/openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key,
                        "-out", cert, "-days", "1", "-subj", "/CN=localhost", "-addext",
                        "subjectAltName=DNS:localhost,IP:127.0.0.1"], capture_output=True, text=True, timeout=60)
    check(r.returncode == 0, f"openssl makes a self-signed certificate {r.stderr[-200:]}")
    state = os.path.join(tmp, "tls-state")
    d = Traind(sys.argv[1], state, ["--http-listen", "127.0.0.1:0", "--tls-cert", cert, "--tls-key", key])
    try:
        d.start()
        with open(os.path.join(state, "ports.json")) as f:
            port = json.load(f)["http"]
        ctx = ssl.create_default_context(cafile=cert)

        def get(url, tok, context=None):
            req = urllib.request.Request(url)
            if tok:
                req.add_header("Authorization", "Bearer " + tok)
            try:
                with urllib.request.urlopen(req, timeout=10, context=context) as resp:
                    return resp.status, resp.read().decode()
            except urllib.error.HTTPError as e:
                return e.code, ""

        code, body = get(f"https://127.0.0.1:{port}/api/jobs", d.token(), ctx)
        check(code == 200 and json.loads(body) == {"jobs": []}, f"HTTPS with the token: {code} {body[:60]}")
        code, _ = get(f"https://127.0.0.1:{port}/api/jobs", "wrong", ctx)
        check(code == 401, f"HTTPS with a wrong token: {code} (want 401)")
        try:
            code, _ = get(f"http://127.0.0.1:{port}/api/jobs", d.token())
            plain = f"answered {code}"
        except (urllib.error.URLError, OSError, http.client.HTTPException) as e:
            plain = f"refused ({e.__class__.__name__})"
        check(plain.startswith("refused"), f"plaintext HTTP on the TLS port is {plain}")
    finally:
        d.stop()


def flag_checks(traind_bin, tmp, check):
    """A given --http-listen that cannot bind stops traind; a plaintext non-loopback one is refused."""
    import socket
    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    held.listen(1)
    port = held.getsockname()[1]
    base = [traind_bin, "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0"]
    try:
        r = subprocess.run(base + ["--state-dir", os.path.join(tmp, "taken"), "--http-listen", f"127.0.0.1:{port}"],
                           capture_output=True, text=True, timeout=60)
        check(r.returncode != 0 and f"cannot listen on 127.0.0.1:{port} for the web page" in r.stderr,
              f"a taken --http-listen port stops traind: exit {r.returncode}, {r.stderr.strip()[-160:]!r}")
    finally:
        held.close()
    r = subprocess.run(base + ["--state-dir", os.path.join(tmp, "remote"), "--http-listen", "0.0.0.0:0"],
                       capture_output=True, text=True, timeout=60)
    check(r.returncode == 2 and "refusing plaintext HTTP on non-loopback address 0.0.0.0:0" in r.stderr,
          f"a plaintext non-loopback --http-listen is refused: exit {r.returncode}, {r.stderr.strip()[-160:]!r}")


class DevTools:
    """The Chrome DevTools protocol over a websocket: one page target, call(method, params)."""

    def __init__(self, ws_url):
        import websocket
        self.ws = websocket.create_connection(ws_url, timeout=30, suppress_origin=True)
        self.next_id = 0

    def call(self, method, **params):
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == self.next_id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})

    def eval(self, expr):
        r = self.call("Runtime.evaluate", expression=expr, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in r:
            raise RuntimeError(f"{expr}: {r['exceptionDetails']}")
        return r["result"].get("value")

    def wait(self, expr, timeout=30.0):
        deadline = time.monotonic() + timeout
        value = None
        while time.monotonic() < deadline:
            value = self.eval(expr)
            if value:
                return value
            time.sleep(0.2)
        return value


def browser_checks(chromium, base, token, job_id, tmp, out_png, check, submit_live):
    profile = os.path.join(tmp, "chromium-profile")
    os.makedirs(profile)
    log = open(os.path.join(tmp, "chromium.log"), "wb")
    proc = subprocess.Popen([chromium, "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
                             "--disable-dev-shm-usage", "--remote-debugging-port=0", "--remote-allow-origins=*",
                             f"--user-data-dir={profile}", "--window-size=1280,1000", "about:blank"],
                            stdout=log, stderr=log)
    try:
        port_file = os.path.join(profile, "DevToolsActivePort")
        deadline = time.monotonic() + 60
        while not os.path.exists(port_file) and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.1)
        if not os.path.exists(port_file):
            raise RuntimeError("chromium did not start its DevTools endpoint; its log:\n" +
                               open(os.path.join(tmp, "chromium.log")).read()[-3000:])
        time.sleep(0.2)
        dt_port = int(open(port_file).read().split()[0])
        with urllib.request.urlopen(f"http://127.0.0.1:{dt_port}/json/list", timeout=10) as r:
            targets = [t for t in json.load(r) if t.get("type") == "page"]
        dt = DevTools(targets[0]["webSocketDebuggerUrl"])
        dt.call("Page.enable")
        dt.call("Page.navigate", url=base + "/")
        check(bool(dt.wait("document.readyState === 'complete' && !!document.getElementById('login')")),
              "the page loads in Chromium")

        def login(tok):
            dt.eval(f"document.getElementById('token').value = {json.dumps(tok)};"
                    "document.getElementById('login-btn').click(); true")

        login("not-the-token")
        err = dt.wait("(document.getElementById('login-error').textContent || '')", 20)
        check("Token refused" in (err or ""), f"a wrong token shows the login error: {err!r}")
        check(dt.eval("sessionStorage.getItem('traind.token') === null && document.getElementById('app').hidden"),
              "a wrong token is not kept and the jobs stay hidden")

        login(token)
        sel = f"#jobs tbody tr[data-job-id={json.dumps(job_id)}]"
        check(bool(dt.wait(f"!!document.querySelector({json.dumps(sel)})", 30)), f"the job row {job_id} is in the DOM")
        state = dt.eval(f"document.querySelector({json.dumps(sel + ' td.state')}).textContent")
        check(state == "SUCCEEDED", f"the row's state cell says {state!r}")
        dt.eval(f"document.querySelector({json.dumps(sel)}).click(); true")  # the newest job is selected first
        check(bool(dt.wait(f"document.getElementById('d-title').textContent.startsWith({json.dumps(job_id)})", 20)),
              "clicking the row shows the job's details")
        pts = dt.wait("Number((document.querySelector('#chart-loss polyline.series-loss') || {dataset: {}}).dataset.points || 0)"
                      f" >= {MAX_STEPS} && document.querySelector('#chart-loss polyline.series-loss').dataset.points", 30)
        check(int(pts or 0) >= MAX_STEPS, f"the loss chart has {pts} points (want >= {MAX_STEPS})")
        n = dt.eval("document.querySelector('#chart-loss polyline.series-loss').getAttribute('points').trim().split(/\\s+/).length")
        check(n >= MAX_STEPS, f"the loss polyline draws {n} points")
        ev = dt.eval("Number((document.querySelector('#chart-loss polyline.series-eval') || {dataset: {}}).dataset.points || 0)")
        check(ev >= 3, f"the eval-loss curve has {ev} points (want >= 3)")
        for chart in ("chart-lr", "chart-gradnorm", "chart-throughput"):
            c = dt.eval(f"Number(document.getElementById('{chart}').dataset.points || 0)")
            check(c >= MAX_STEPS, f"{chart} has {c} points")
        check(bool(dt.eval("!!document.querySelector('#memory rect.mem-peak') && "
                           "Number(document.querySelector('#memory rect.mem-peak').getAttribute('width')) > 0")),
              "the memory chart draws the measured peak")
        check("max_steps: 40" in (dt.eval("document.getElementById('spec').textContent") or ""), "the spec is shown")
        check("eval loss" in (dt.eval("document.getElementById('events').textContent") or ""), "the events are shown")
        check("model.safetensors" in (dt.eval("document.getElementById('outputs').textContent") or ""),
              "the output paths are shown")
        check(dt.eval("sessionStorage.getItem('traind.token')") == token, "the token is in sessionStorage")
        check(token not in dt.eval("location.href + ' ' + performance.getEntriesByType('resource').map(e => e.name).join(' ')"),
              "the token is in no URL the page loaded")
        time.sleep(0.5)
        # The top of the page (job list and charts), scaled down: a small PNG for the README.
        shot = dt.call("Page.captureScreenshot", format="png",
                       clip={"x": 0, "y": 0, "width": 1280, "height": 680, "scale": 0.75})
        os.makedirs(os.path.dirname(os.path.abspath(out_png)), exist_ok=True)
        with open(out_png, "wb") as f:
            f.write(base64.b64decode(shot["data"]))
        check(os.path.getsize(out_png) > 10_000, f"screenshot {out_png} ({os.path.getsize(out_png)} bytes)")

        # A running job: its curves grow while the page polls, and its cancel button stops it.
        live_id = subprocess.run(submit_live, capture_output=True, text=True, timeout=60).stdout.strip()
        live_sel = json.dumps(f"#jobs tbody tr[data-job-id={json.dumps(live_id)}]")
        check(bool(dt.wait(f"!!document.querySelector({live_sel})", 20)), f"the new job {live_id} appears in the list")
        dt.eval(f"document.querySelector({live_sel}).click(); true")
        loss_pts = "Number((document.querySelector('#chart-loss polyline.series-loss') || {dataset: {}}).dataset.points || 0)"
        first = dt.wait(f"document.getElementById('d-state').textContent === 'RUNNING' && {loss_pts} > 0 && {loss_pts}", 30)
        later = dt.wait(f"{loss_pts} > {int(first or 0)} && {loss_pts}", 20)
        msg = dt.eval("document.getElementById('d-msg').textContent")
        check(bool(first) and bool(later) and later > first,
              f"the running job's loss curve grows: {first} then {later} points (page message: {msg!r})")
        # A long job's curve is thinned for drawing (50,000 points -> at most 1,201), keeping its
        # first and last points and its extremes (a spike at step 31,337).
        th = dt.eval("(() => { const p = Array.from({length: 50000}, (_, i) => [i + 1, 2 + Math.sin(i / 500)]);"
                     " p[31336][1] = 40; const t = thin(p, 1200);"
                     " return JSON.stringify({n: t.length, first: t[0][0], last: t[t.length - 1][0],"
                     " spike: t.some((q) => q[0] === 31337 && q[1] === 40),"
                     " sorted: t.every((q, k) => k === 0 || q[0] > t[k - 1][0])}); })()")
        th = json.loads(th or "{}")
        check(0 < th.get("n", 0) <= 1201 and th.get("first") == 1 and th.get("last") == 50000 and th.get("spike")
              and th.get("sorted"), f"a 50,000-point curve is thinned for drawing, ends and spike kept: {th}")
        check(bool(dt.eval("!document.getElementById('cancel').hidden")), "a running job shows the cancel button")
        dt.eval("document.getElementById('cancel').click(); true")
        st = dt.wait(f"document.querySelector({json.dumps(f'#jobs tbody tr[data-job-id={json.dumps(live_id)}] td.state')}).textContent"
                     " === 'CANCELLED' && 'CANCELLED'", 30)
        check(st == "CANCELLED", f"the page's cancel button cancels {live_id}: row state {st!r}")
        # The row (job list poll) and the detail panel (its own poll) refresh separately: wait for the
        # panel's next refresh rather than reading it the moment the row turned.
        check(bool(dt.wait("document.getElementById('cancel').hidden", 15)), "a cancelled job has no cancel button")
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


if __name__ == "__main__":
    sys.exit(main())

