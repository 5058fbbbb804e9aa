#!/usr/bin/python3
"""Structural test of deploy/grafana/traind.json (what Grafana's dashboard schema needs to load it
and what the issue asks of it): valid JSON; title/uid/schemaVersion/panels; templating variables
datasource, instance and job (the training job, label job_name) with an all-value regex; every
panel has an id, a type, a gridPos, a Prometheus datasource, at least one target with a non-empty
expr and a refId, a unit; panel ids unique; every metric name in an expr is exported by traind
(server/metrics.cc, METRICS.md); the panels cover the topics of issue 16.

  check_dashboard.py DASHBOARD.json METRICS_CC
"""
import json
import re
import sys


def exported_metrics(metrics_cc):
    names = set(re.findall(r'Name\("(traind_[a-z0-9_]+)"\)', open(metrics_cc).read()))
    if not names:
        raise SystemExit(f"no metric names found in {metrics_cc}")
    return names


def metric_names(expr):
    """traind_* names in a PromQL expression, with histogram suffixes mapped to the family."""
    out = set()
    for n in re.findall(r"\btraind_[a-z0-9_]+", expr):
        out.add(re.sub(r"_(bucket|sum|count)$", "", n) if re.search(r"_seconds_(bucket|sum|count)$", n) else n)
    return out


def main():
    dash_path, metrics_cc = sys.argv[1], sys.argv[2]
    errors = []
    d = json.load(open(dash_path))
    names = exported_metrics(metrics_cc)
    for key in ("title", "uid", "schemaVersion", "panels", "templating"):
        if key not in d:
            errors.append(f"dashboard has no '{key}'")
    if not isinstance(d.get("schemaVersion"), int) or d.get("schemaVersion", 0) < 30:
        errors.append("schemaVersion must be an integer >= 30")
    variables = {v.get("name"): v for v in d.get("templating", {}).get("list", [])}
    for want in ("datasource", "instance", "job"):
        if want not in variables:
            errors.append(f"templating variable ${want} is missing")
    if "datasource" in variables and variables["datasource"].get("type") != "datasource":
        errors.append("$datasource must be of type datasource")
    if variables.get("datasource", {}).get("query") != "prometheus":
        errors.append("$datasource must select prometheus data sources")
    for v in ("instance", "job"):
        var = variables.get(v, {})
        q = var.get("query", {})
        q = q.get("query", "") if isinstance(q, dict) else q
        if var.get("type") != "query" or not q.startswith("label_values("):
            errors.append(f"${v} must be a query variable with label_values(...), got {q!r}")
        if var.get("includeAll") and var.get("allValue") != ".*":
            errors.append(f"${v}: includeAll needs allValue '.*' (the exprs use =~)")
        for n in metric_names(q):
            if n not in names:
                errors.append(f"${v} queries {n}, which traind does not export")
    if "label_values(" in str(variables.get("job", {}).get("query")) and "job_name)" not in str(variables["job"]["query"]):
        errors.append("$job must list the job_name label")

    panels = d.get("panels", [])
    if len(panels) < 10:
        errors.append(f"only {len(panels)} panels")
    ids = [p.get("id") for p in panels]
    if len(set(ids)) != len(ids) or None in ids:
        errors.append(f"panel ids must be present and unique: {ids}")
    all_exprs = []
    for p in panels:
        t = p.get("title") or f"panel {p.get('id')}"
        if not p.get("type"):
            errors.append(f"{t}: no type")
        gp = p.get("gridPos", {})
        if not all(isinstance(gp.get(k), int) for k in ("h", "w", "x", "y")):
            errors.append(f"{t}: gridPos needs integer h, w, x, y")
        ds = p.get("datasource")
        if not isinstance(ds, dict) or ds.get("type") != "prometheus" or not ds.get("uid"):
            errors.append(f"{t}: no prometheus datasource ({ds!r})")
        unit = p.get("fieldConfig", {}).get("defaults", {}).get("unit")
        if not unit:
            errors.append(f"{t}: no unit in fieldConfig.defaults.unit")
        targets = p.get("targets", [])
        if not targets:
            errors.append(f"{t}: no query targets")
        refids = [x.get("refId") for x in targets]
        if len(set(refids)) != len(refids) or None in refids:
            errors.append(f"{t}: target refIds must be present and unique: {refids}")
        for x in targets:
            e = x.get("expr", "").strip()
            if not e:
                errors.append(f"{t}: target {x.get('refId')} has no expr")
                continue
            all_exprs.append(e)
            if e.count("(") != e.count(")") or e.count("{") != e.count("}") or e.count("[") != e.count("]"):
                errors.append(f"{t}: unbalanced brackets in {e}")
            used = metric_names(e)
            if not used:
                errors.append(f"{t}: {e} uses no traind metric")
            for n in used:
                if n not in names:
                    errors.append(f"{t}: {e} uses {n}, which traind does not export (server/metrics.cc)")
            if '$instance' not in e:
                errors.append(f"{t}: {e} does not filter on $instance")
            if x.get("datasource") and x["datasource"] != ds:
                errors.append(f"{t}: target datasource differs from the panel's")
    text = "\n".join(all_exprs)
    # Issue 16's panel list, by the metric each topic needs.
    topics = {
        "throughput": "traind_train_tokens_per_second", "loss": "traind_train_loss", "eval loss": "traind_eval_loss",
        "learning rate": "traind_train_learning_rate", "grad norm": "traind_train_grad_norm",
        "MFU": "traind_model_flops_utilization", "step-time quantiles": "histogram_quantile(",
        "memory by kind": "traind_device_memory_bytes", "memory peak": "traind_device_memory_peak_bytes",
        "dataloader wait": "traind_dataloader_wait_seconds_total", "offload I/O": "traind_offload_read_bytes_total",
        "queue length": "traind_queue_length", "jobs by state": "traind_jobs", "gRPC by code": "traind_grpc_requests_total",
    }
    for topic, needle in topics.items():
        if needle not in text:
            errors.append(f"no panel for {topic} ({needle})")
    if "traind_train_step_seconds_bucket" not in text:
        errors.append("step-time quantiles must come from traind_train_step_seconds_bucket")
    for e in all_exprs:
        if any(m in e for m in ("traind_train_", "traind_eval_", "traind_model_", "traind_dataloader_",
                                "traind_offload_", "traind_device_memory_bytes")) and '$job' not in e:
            errors.append(f"per-job expr does not filter on $job: {e}")
    if errors:
        print("\n".join("FAIL: " + e for e in errors))
        return 1
    print(f"OK: {len(panels)} panels, {len(all_exprs)} queries, variables {sorted(variables)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
