#!/usr/bin/env python3
"""kiln report: one self-contained HTML page (PNG plots embedded as base64) from the JSON
results in a folder: `kiln bench --export-json` records, PyTorch baseline records in the same
schema, `kiln compare --export-json` results and an environment record. docs/report.md
describes the schemas.

  scripts/report.py RESULTS_DIR -o report.html [--title T]

Errors are one line on stderr and exit status 1 (kiln report shows that line).
"""
import argparse
import base64
import glob
import html
import io
import json
import os
import sys

FRAMEWORK_STYLE = {"kiln": "-", "pytorch-eager": ":", "torch.compile": "--"}
PRECISIONS = ["fp32", "tf32", "fp16", "int8"]


class ReportError(Exception):
    pass


def load(results_dir):
    bench, compare, env = [], [], []
    files = sorted(glob.glob(os.path.join(results_dir, "*.json")))
    if not files:
        raise ReportError(f"{results_dir}: no *.json result files")
    for path in files:
        try:
            with open(path) as f:
                doc = json.load(f)
        except (OSError, ValueError) as e:
            raise ReportError(f"{path}: not valid JSON ({e})")
        if not isinstance(doc, dict):
            raise ReportError(f"{path}: a result file must hold a JSON object")
        schema = doc.get("schema", "")
        if schema.startswith("kiln.bench/"):
            recs = doc.get("records", [doc])
            for r in recs:
                for key in ("batch", "precision", "framework", "model"):
                    if key not in r:
                        raise ReportError(f"{path}: bench record lacks '{key}'")
                r["_file"] = os.path.basename(path)
                bench.append(r)
        elif schema.startswith("kiln.compare/"):
            doc["_file"] = os.path.basename(path)
            compare.append(doc)
        elif schema.startswith("kiln.env/"):
            env.append(doc)
        # other JSON (timing caches, raw logs) is not a result: skipped
    if not bench and not compare:
        raise ReportError(f"{results_dir}: no kiln.bench or kiln.compare results among {len(files)} JSON files")
    return bench, compare, env


def png(fig):
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    import matplotlib.pyplot as plt
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def series(bench, model, key):
    """{(framework, precision): [(batch, value)]} for one model."""
    out = {}
    for r in bench:
        if r["model"] != model:
            continue
        v = key(r)
        if v is None:
            continue
        out.setdefault((r["framework"], r["precision"]), []).append((r["batch"], v))
    return {k: sorted(v) for k, v in out.items()}


def median_ms(r):
    lat = r.get("compute_ms") or r.get("latency_ms") or {}
    return lat.get("median")


def throughput(r):
    if r.get("throughput_per_s"):
        return r["throughput_per_s"]
    ms = median_ms(r)
    return r["batch"] * 1000.0 / ms if ms else None


def line_plot(plt, data, title, ylabel, logy=False):
    fig, ax = plt.subplots(figsize=(7, 4.2))
    colors = {p: f"C{i}" for i, p in enumerate(PRECISIONS)}
    for (fw, prec), pts in sorted(data.items()):
        xs, ys = zip(*pts)
        ax.plot(xs, ys, FRAMEWORK_STYLE.get(fw, "-."), marker="o", ms=3, color=colors.get(prec, "k"),
                label=f"{fw} {prec}")
    ax.set_xscale("log", base=2)
    if logy:
        ax.set_yscale("log")
    ax.set_xlabel("batch")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2, handlelength=3.5)  # long enough to tell dashed from solid
    return png(fig)


def speedup_plot(plt, bench, model):
    tput = series(bench, model, throughput)
    fig, ax = plt.subplots(figsize=(7, 4.2))
    drawn = False
    for i, prec in enumerate(PRECISIONS):
        k, c = dict(tput.get(("kiln", prec), [])), dict(tput.get(("torch.compile", prec), []))
        batches = sorted(set(k) & set(c))
        if batches:
            ax.plot(batches, [k[b] / c[b] for b in batches], marker="o", color=f"C{i}", label=f"kiln {prec}")
            drawn = True
    if not drawn:
        plt.close(fig)
        return None
    ax.axhline(1.0, color="gray", lw=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("batch")
    ax.set_ylabel("kiln throughput / torch.compile")
    ax.set_title(f"{model}: speedup over torch.compile (same precision)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return png(fig)


def memory_plot(plt, bench, model):
    rows = {}
    for r in bench:
        if r["model"] == model and r["framework"] == "kiln" and r.get("memory"):
            cur = rows.get(r["precision"])
            if cur is None or r["batch"] > cur["batch"]:
                rows[r["precision"]] = r
    if not rows:
        return None
    precs = [p for p in PRECISIONS if p in rows] + [p for p in rows if p not in PRECISIONS]
    w = [rows[p]["memory"].get("weights", 0) / 2**20 for p in precs]
    a = [rows[p]["memory"].get("activations", 0) / 2**20 for p in precs]
    fig, ax = plt.subplots(figsize=(6, 3.8))
    ax.bar(precs, w, label="weights")
    ax.bar(precs, a, bottom=w, label="activations")
    ax.set_ylabel("MiB on the device")
    ax.set_title(f"{model}: memory per precision (at batch {', '.join(str(rows[p]['batch']) for p in precs)})")
    ax.legend(fontsize=8)
    return png(fig)


def accuracy_rows(compare):
    rows = []
    for doc in compare:
        for e in doc.get("engines", []):
            out = (e.get("outputs") or [{}])[0]
            ds = e.get("dataset") or {}
            rows.append({"model": os.path.basename(doc.get("model", "?")), "precision": e.get("precision", "?"),
                         "engine": e.get("label", "?"), "rel_l2": out.get("rel_l2"), "cosine": out.get("cosine"),
                         "top1_agreement": out.get("top1_agreement"), "max_abs": out.get("max_abs"),
                         "dataset_top1": ds.get("top1"), "dataset_top5": ds.get("top5"),
                         "first_jump": (e.get("per_layer") or {}).get("first_jump"), "file": doc["_file"]})
    return rows


def accuracy_plot(plt, rows):
    if not rows:
        return None
    fig, ax = plt.subplots(figsize=(7, 3.8))
    models = sorted({r["model"] for r in rows})
    for i, m in enumerate(models):
        rs = [r for r in rows if r["model"] == m and r["rel_l2"] is not None]
        ax.plot([r["precision"] for r in rs], [max(r["rel_l2"], 1e-12) for r in rs], "o-", color=f"C{i}", label=m)
    ax.set_yscale("log")
    ax.set_ylabel("relative L2 error vs float64 reference")
    ax.set_title("accuracy per precision (first output)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return png(fig)


def table(rows, cols):
    def fmt(v):
        if isinstance(v, float):
            return f"{v:.4g}"
        return html.escape("" if v is None else str(v))
    head = "".join(f"<th>{html.escape(c)}</th>" for c in cols)
    body = "".join("<tr>" + "".join(f"<td>{fmt(r.get(c))}</td>" for c in cols) + "</tr>" for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def build_html(bench, compare, env, title, save_plots=None):
    """The page; with save_plots, every plot also as DIR/<model>_<kind>.png (the README's plot:
    scripts/report.py RESULTS --save-plots docs/img, then resnet50_throughput.png)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    parts = [f"<h1>{html.escape(title)}</h1>"]
    for e in env:
        parts.append("<h2>Environment</h2>" + table([{"key": k, "value": v} for k, v in e.items() if k != "schema"],
                                                     ["key", "value"]))
    for model in sorted({r["model"] for r in bench}):
        parts.append(f"<h2>{html.escape(model)}</h2>")
        imgs = [line_plot(plt, series(bench, model, median_ms), f"{model}: latency vs batch", "median latency (ms)", logy=True),
                line_plot(plt, series(bench, model, throughput), f"{model}: throughput vs batch", "images / s"),
                speedup_plot(plt, bench, model), memory_plot(plt, bench, model)]
        parts += [f'<img src="data:image/png;base64,{i}">' for i in imgs if i]
        if save_plots:
            for kind, i in zip(("latency", "throughput", "speedup", "memory"), imgs):
                if i:
                    with open(os.path.join(save_plots, f"{model}_{kind}.png"), "wb") as f:
                        f.write(base64.b64decode(i))
    acc = accuracy_rows(compare)
    if acc:
        parts.append("<h2>Accuracy</h2>")
        img = accuracy_plot(plt, acc)
        if img:
            parts.append(f'<img src="data:image/png;base64,{img}">')
        parts.append(table(acc, ["model", "precision", "engine", "max_abs", "rel_l2", "cosine", "top1_agreement",
                                 "dataset_top1", "dataset_top5", "first_jump", "file"]))
    if bench:
        rows = [dict(r, median_ms=median_ms(r), throughput_per_s=throughput(r),
                     p99_ms=(r.get("compute_ms") or r.get("latency_ms") or {}).get("p99"),
                     weights_mib=(r.get("memory") or {}).get("weights", 0) / 2**20 if r.get("memory") else None,
                     activations_mib=(r.get("memory") or {}).get("activations", 0) / 2**20 if r.get("memory") else None,
                     warnings="; ".join(r.get("warnings", [])))
                for r in sorted(bench, key=lambda r: (r["model"], r["framework"], r["precision"], r["batch"]))]
        parts.append("<h2>Every number</h2>" + table(rows, ["model", "framework", "precision", "batch", "median_ms", "p99_ms",
                                                           "throughput_per_s", "weights_mib", "activations_mib", "gpu",
                                                           "warnings", "command", "_file"]))
    style = ("body{font-family:sans-serif;max-width:1100px;margin:auto}img{max-width:49%;margin:2px}"
             "table{border-collapse:collapse;font-size:12px}td,th{border:1px solid #ccc;padding:2px 6px}")
    return f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title><style>{style}</style></head><body>{''.join(parts)}</body></html>\n"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("results")
    ap.add_argument("-o", "--output", default="report.html")
    ap.add_argument("--title", default="kiln benchmark report")
    ap.add_argument("--save-plots", metavar="DIR", help="also write each plot as DIR/<model>_<kind>.png")
    args = ap.parse_args()
    try:
        bench, compare, env = load(args.results)
        if args.save_plots:
            try:
                os.makedirs(args.save_plots, exist_ok=True)
            except OSError as e:
                raise ReportError(f"cannot create {args.save_plots}: {e.strerror}")
        page = build_html(bench, compare, env, args.title, args.save_plots)
        try:
            with open(args.output, "w") as f:
                f.write(page)
        except OSError as e:
            raise ReportError(f"cannot write {args.output}: {e.strerror}")
    except ReportError as e:
        print(str(e).replace("\n", " "), file=sys.stderr)
        return 1
    except ImportError as e:
        print(f"{e} (run scripts/setup.sh: matplotlib)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
