#!/usr/bin/env python3
"""deploy/k8s/ validated offline (no cluster): every manifest through kubectl, then the wiring a
2-rank data-parallel run depends on, then the ConfigMap's job spec through traind's own parser.

usage: k8s_manifests_test.py KUBECTL TRAIND TRAINCTL MANIFEST_DIR

1. kubectl (Debian's kubernetes-client; ./run.sh deps installs it; missing = FAIL, not a skip)
   decodes every file with `kubectl label --local -f FILE traind.dev/validated=true -o json`:
   --local never contacts a server (apply/create --dry-run=client still ask a server for API
   discovery, localhost:8080 without a kubeconfig). To prove it, KUBECONFIG points at nothing and
   --server at a closed loopback port: any request would fail the command. kubectl must parse the
   YAML, find apiVersion and kind in every object, and print each object back with the label.
   (Schema validation needs a server's OpenAPI document: the field checks below stand in for it.)
2. The objects: kinds are ConfigMap, Service, PersistentVolumeClaim, Job only; every Job is an
   Indexed Job with completions == parallelism == WORLD_SIZE, restartPolicy OnFailure (a dead
   rank's container restarts in place and rejoins the world: `traind run --max-restarts N`,
   N >= 1, docs/distributed.md), backoffLimit >= N (the container restarts the world's N restarts
   cost) and small (<= 10), subdomain = a headless Service (clusterIP None,
   publishNotReadyAddresses) whose selector matches the pod labels and whose port is MASTER_PORT;
   MASTER_ADDR = <job>-0.<service>...; RANK unset (traind reads JOB_COMPLETION_INDEX) or taken from
   the completion index; $(VAR) references defined earlier in env; command `traind run <spec>
   --device D --resume --max-restarts N` with <spec> a key of a ConfigMap mounted there; nvidia.com/gpu: 1 exactly
   where the device is cuda:N; the default manifest (deploy/k8s/job.yaml) on cpu (data parallel is
   tested on the cpu backend only: NCCL, which the image installs, has never run on a GPU); the data volume is a ReadWriteMany PVC of
   the set, and the spec's train_file and output_dir lie on it.
3. The ConfigMap's job.yaml: `trainctl estimate` against a cpu traind on loopback (the daemon
   parses it with engine::ParseJobSpec and plans it); exit 0 and a plan. The same spec with an
   unknown key in its distributed block must be refused (exit 2): the parser really ran.
   `traind run` is never started.
"""
import glob
import json
import os
import re
import shutil
import subprocess
import sys

import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from traind_proc import Traind, temp_dir  # noqa: E402

LABEL = "traind.dev/validated=true"
KINDS = {"ConfigMap": "v1", "Service": "v1", "PersistentVolumeClaim": "v1", "Job": "batch/v1"}
failures = []


def check(cond, msg):
    if not cond:
        failures.append(msg)
        print("FAIL: " + msg, flush=True)
    return cond


def die(msg):
    print("FAIL: " + msg, flush=True)
    sys.exit(1)


def kubectl_objects(kubectl, path, env):
    cmd = [kubectl, "label", "--local", "-f", path, LABEL, "-o", "json", "--server", "http://127.0.0.1:1"]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
    if p.returncode != 0:
        die(f"{' '.join(cmd)} exited {p.returncode}:\n{p.stderr}")
    # Several objects come back as concatenated JSON documents.
    objs, dec, text, i = [], json.JSONDecoder(), p.stdout, 0
    while True:
        while i < len(text) and text[i].isspace():
            i += 1
        if i == len(text):
            break
        obj, i = dec.raw_decode(text, i)
        objs.append(obj)
    check(objs, f"{path}: kubectl printed no object")
    for o in objs:
        check(o.get("metadata", {}).get("labels", {}).get("traind.dev/validated") == "true",
              f"{path}: {o.get('kind')} came back without the label kubectl was asked to add")
    return objs


def env_of(container):
    return {e["name"]: e for e in container.get("env", [])}


def main():
    if len(sys.argv) != 5:
        die(__doc__)
    kubectl_arg, traind_bin, trainctl_bin, mdir = sys.argv[1:]
    kubectl = shutil.which(kubectl_arg) if not os.path.isabs(kubectl_arg) else kubectl_arg
    if not kubectl or not os.access(kubectl, os.X_OK):
        die(f"kubectl not found ({kubectl_arg}): install Debian's kubernetes-client "
            "(apt-get install kubernetes-client; ./run.sh deps installs it)")
    env = dict(os.environ)
    env["KUBECONFIG"] = os.path.join(temp_dir("traind-k8s-kubeconfig-"), "absent")
    env.pop("KUBERNETES_SERVICE_HOST", None)
    env.pop("KUBERNETES_SERVICE_PORT", None)
    v = subprocess.run([kubectl, "version", "--client"], env=env, capture_output=True, text=True)
    print(f"kubectl: {kubectl}: {(v.stdout or v.stderr).strip().splitlines()[0] if (v.stdout or v.stderr) else '?'}")

    files = sorted(glob.glob(os.path.join(mdir, "**", "*.yaml"), recursive=True))
    check(files, f"no manifests under {mdir}")
    objs = []  # (file, object)
    for f in files:
        got = kubectl_objects(kubectl, f, env)
        print(f"kubectl ok: {os.path.relpath(f, mdir)}: " + ", ".join(f"{o['kind']}/{o['metadata']['name']}" for o in got))
        objs += [(os.path.relpath(f, mdir), o) for o in got]

    for f, o in objs:
        check(o["kind"] in KINDS, f"{f}: unexpected kind {o['kind']} (expected one of {sorted(KINDS)})")
        if o["kind"] in KINDS:
            check(o["apiVersion"] == KINDS[o["kind"]], f"{f}: {o['kind']} has apiVersion {o['apiVersion']}")
    by_kind = {}
    for f, o in objs:
        by_kind.setdefault(o["kind"], {}).setdefault(o["metadata"]["name"], o)
    for kind in KINDS:
        check(by_kind.get(kind), f"no {kind} in {mdir}")
    configmaps = by_kind.get("ConfigMap", {})
    services = by_kind.get("Service", {})
    pvcs = by_kind.get("PersistentVolumeClaim", {})

    for name, s in services.items():
        check(s["spec"].get("clusterIP") == "None", f"Service {name}: not headless (clusterIP: None)")
        check(s["spec"].get("publishNotReadyAddresses") is True,
              f"Service {name}: publishNotReadyAddresses is not true (rank 0 must resolve before it is Ready)")
    for name, p in pvcs.items():
        check("ReadWriteMany" in p["spec"].get("accessModes", []),
              f"PVC {name}: not ReadWriteMany (two machines share output_dir and the checkpoints)")

    jobs = [(f, o) for f, o in objs if o["kind"] == "Job"]
    devices = {}
    specs_checked = set()
    for f, job in jobs:
        js, name = job["spec"], job["metadata"]["name"]
        where = f"{f}: Job {name}"
        check(js.get("completionMode") == "Indexed", f"{where}: completionMode is {js.get('completionMode')}, not Indexed")
        comp, par = js.get("completions"), js.get("parallelism")
        check(isinstance(comp, int) and comp >= 2, f"{where}: completions {comp!r} is not an integer >= 2")
        check(comp == par, f"{where}: completions {comp} != parallelism {par}")
        pod = js["template"]["spec"]
        labels = js["template"].get("metadata", {}).get("labels", {})
        check(pod.get("restartPolicy") == "OnFailure",
              f"{where}: restartPolicy {pod.get('restartPolicy')}, expected OnFailure (the kubelet restarts a "
              "dead rank's container in place, and it rejoins the others' next round)")
        sub = pod.get("subdomain")
        svc = services.get(sub)
        check(svc is not None, f"{where}: subdomain {sub!r} is not a Service of {mdir}")
        if svc:
            sel = svc["spec"].get("selector", {})
            check(sel and all(labels.get(k) == v for k, v in sel.items()),
                  f"{where}: pod labels {labels} do not match Service {sub}'s selector {sel}")
        check(len(pod.get("containers", [])) == 1, f"{where}: expected one container")
        c = pod["containers"][0]
        env = env_of(c)
        names = [e["name"] for e in c.get("env", [])]
        check(env.get("WORLD_SIZE", {}).get("value") == str(comp),
              f"{where}: WORLD_SIZE {env.get('WORLD_SIZE')} != completions {comp}")
        if "RANK" in env:
            fp = env["RANK"].get("valueFrom", {}).get("fieldRef", {}).get("fieldPath", "")
            check("job-completion-index" in fp, f"{where}: RANK is set but not from the completion index: {env['RANK']}")
        for e in c.get("env", []):
            for ref in re.findall(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", e.get("value", "")):
                check(ref in names[: names.index(e["name"])],
                      f"{where}: {e['name']} refers to $({ref}), not defined before it (Kubernetes leaves it unexpanded)")
        addr = env.get("MASTER_ADDR", {}).get("value", "")
        check(addr.startswith(f"{name}-0.{sub}"),
              f"{where}: MASTER_ADDR {addr!r} is not rank 0's name through the headless service ({name}-0.{sub}...)")
        port = env.get("MASTER_PORT", {}).get("value")
        if svc:
            check(port is not None and int(port) in [p.get("port") for p in svc["spec"].get("ports", [])],
                  f"{where}: MASTER_PORT {port} is not a port of Service {sub}")
        cmd = c.get("command", []) + c.get("args", [])
        check(len(cmd) >= 3 and os.path.basename(cmd[0]) == "traind" and cmd[1] == "run",
              f"{where}: command {cmd} is not `traind run SPEC ...`")
        check("--resume" in cmd, f"{where}: no --resume (a restarted container must continue from the last checkpoint)")
        restarts = cmd[cmd.index("--max-restarts") + 1] if "--max-restarts" in cmd[:-1] else None
        check(restarts is not None and restarts.isdigit() and int(restarts) >= 1,
              f"{where}: --max-restarts {restarts!r}, expected an integer >= 1 (the ranks restart the world "
              "themselves when one dies)")
        limit = js.get("backoffLimit")
        if restarts is not None and restarts.isdigit():
            check(isinstance(limit, int) and int(restarts) <= limit <= 10,
                  f"{where}: backoffLimit {limit!r}, expected from --max-restarts {restarts} to 10 (each restart "
                  "of the world restarts one container, which the Job counts; past it the Job fails)")
        device = cmd[cmd.index("--device") + 1] if "--device" in cmd else None
        check(device == "cpu" or (device or "").startswith("cuda:"), f"{where}: --device {device!r}")
        devices[f] = device
        gpus = c.get("resources", {}).get("limits", {}).get("nvidia.com/gpu")
        if (device or "").startswith("cuda:"):
            check(str(gpus) == "1", f"{where}: --device {device} but resources.limits nvidia.com/gpu is {gpus!r}, expected 1")
        else:
            check(gpus is None, f"{where}: --device {device} holds a GPU it does not use (nvidia.com/gpu {gpus})")
        # The spec file: a key of a ConfigMap mounted at its folder.
        vols = {v["name"]: v for v in pod.get("volumes", [])}
        mounts = {m["mountPath"].rstrip("/"): m for m in c.get("volumeMounts", [])}
        spec_path = cmd[2] if len(cmd) >= 3 else ""
        folder, key = os.path.dirname(spec_path), os.path.basename(spec_path)
        m = mounts.get(folder)
        cm_name = vols.get(m["name"], {}).get("configMap", {}).get("name") if m else None
        cm = configmaps.get(cm_name)
        check(cm is not None and key in cm.get("data", {}),
              f"{where}: {spec_path} is not a key of a ConfigMap mounted at {folder}")
        data_mounts = [(p, vols.get(mm["name"], {}).get("persistentVolumeClaim", {}).get("claimName"))
                       for p, mm in mounts.items()]
        data_mounts = [(p, claim) for p, claim in data_mounts if claim]
        check(len(data_mounts) == 1 and data_mounts[0][1] in pvcs,
              f"{where}: expected one PVC of the set mounted (output_dir must outlive the pods): {data_mounts}")
        if cm is not None and key in cm.get("data", {}) and data_mounts:
            spec = yaml.safe_load(cm["data"][key])
            root = data_mounts[0][0] + "/"
            check(spec.get("output_dir", "").startswith(root), f"{where}: output_dir {spec.get('output_dir')} is not on the shared volume {root}")
            check(spec.get("data", {}).get("train_file", "").startswith(root),
                  f"{where}: data.train_file {spec.get('data', {}).get('train_file')} is not on the shared volume {root}")
            check(isinstance(spec.get("distributed"), dict),
                  f"{where}: the spec has no distributed block (without one traind run trains alone)")
            for k in ("world_size", "rank"):
                check(k not in (spec.get("distributed") or {}),
                      f"{where}: the spec fixes distributed.{k}: every pod reads the same spec, it must come from the environment")
            specs_checked.add((cm_name, key))

    check(devices.get("job.yaml") == "cpu",
          f"job.yaml (the default) runs --device {devices.get('job.yaml')!r}: data parallel is tested on cpu only (NCCL has never run on a GPU)")
    check(any((d or "").startswith("cuda:") for d in devices.values()), "no GPU variant (a Job with --device cuda:N)")

    # 3. The embedded spec through traind's parser.
    tmp = temp_dir("traind-k8s-")
    t = Traind(traind_bin, os.path.join(tmp, "state"), ["--device", "cpu"])
    t.start()
    try:
        for cm_name, key in sorted(specs_checked):
            text = configmaps[cm_name]["data"][key]
            path = os.path.join(tmp, f"{cm_name}-{key}")
            with open(path, "w") as f:
                f.write(text)
            base = [trainctl_bin, "--addr", t.addr, "--state-dir", t.state_dir, "-o", "json", "estimate"]
            p = subprocess.run(base + [path], capture_output=True, text=True, timeout=120)
            ok = check(p.returncode == 0, f"ConfigMap {cm_name} {key}: trainctl estimate exited {p.returncode}: {p.stderr.strip()}")
            if ok:
                plan = json.loads(p.stdout).get("plan", {})
                check(plan.get("micro_batch", 0) >= 1 and int(plan.get("bytes", {}).get("total", 0)) > 0,
                      f"ConfigMap {cm_name} {key}: estimate gave no plan: {p.stdout}")
                print(f"traind parses ConfigMap {cm_name} {key}: micro_batch {plan.get('micro_batch')}, "
                      f"{int(plan['bytes']['total']) / 2**20:.1f} MiB planned")
            bad = yaml.safe_load(text)
            bad["distributed"] = dict(bad.get("distributed") or {}, wrld_size=2)
            bad_path = path + ".bad.yaml"
            with open(bad_path, "w") as f:
                yaml.safe_dump(bad, f)
            p = subprocess.run(base + [bad_path], capture_output=True, text=True, timeout=120)
            check(p.returncode == 2 and "wrld_size" in p.stderr,
                  f"ConfigMap {cm_name} {key} with distributed.wrld_size: expected exit 2 naming it, got "
                  f"{p.returncode}: {p.stderr.strip()}")
    finally:
        t.stop()
    check(specs_checked, "no job spec was checked")

    if failures:
        print(f"{len(failures)} check(s) failed")
        return 1
    print(f"ok: {len(files)} files, {len(objs)} objects, {len(jobs)} Jobs, {len(specs_checked)} spec(s)")
    shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
