#!/usr/bin/env python3
"""`kiln perf` end to end: a `kiln serve` on the cpu backend on free localhost ports with two tiny
engines, loaded over HTTP and gRPC, with and without system shared memory, a short concurrency
sweep and a request rate; the JSON and CSV reports are checked (requests answered, no errors,
percentiles in order, the server's counters agreeing with the client's), nothing is left in
/dev/shm or registered with the server (SIGINT included), and bad input gives one line on stderr
and exit status 1. About 30 s on a 2-core machine."""
import argparse
import csv
import glob
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "scripts", "models"))

FAILURES = []


def check(label, ok, detail=""):
    print(f"{'ok  ' if ok else 'FAIL'} {label}{'' if ok or not detail else ': ' + detail}")
    if not ok:
        FAILURES.append(label)
    return ok


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(url):
    with urllib.request.urlopen(url, timeout=10) as r:
        return r.read().decode()


def make_repository(kiln, d):
    """mlp.kiln: [N, 64] -> [N, 10], batch 1..8; seq.kiln: y = 2x of [N, S], S dynamic 1..16."""
    import onnx
    from onnx import TensorProto, helper

    import small_models

    onnx.save(small_models.mlp(), os.path.join(d, "mlp.onnx"))
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", "S"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", "S"])
    two = helper.make_tensor("two", TensorProto.FLOAT, [], [2.0])
    g = helper.make_graph([helper.make_node("Mul", ["x", "two"], ["y"])], "seq", [x], [y], [two])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]),
              os.path.join(d, "seq.onnx"))
    repo = os.path.join(d, "repo")
    os.makedirs(repo)
    for name, shapes in (("mlp", ("x:1x64", "x:4x64", "x:8x64")),
                         ("seq", ("x:1x1", "x:4x8", "x:8x16"))):
        subprocess.run([kiln, "build", "--onnx", os.path.join(d, f"{name}.onnx"), "--backend", "cpu",
                        "--min-shapes", shapes[0], "--opt-shapes", shapes[1], "--max-shapes",
                        shapes[2], "--save-engine", os.path.join(repo, f"{name}.kiln")],
                       check=True, capture_output=True)
    return repo


def start_server(kiln, repo, log_path):
    http, grpc = free_port(), free_port()
    log = open(log_path, "w+")
    proc = subprocess.Popen([kiln, "serve", repo, "--host", "127.0.0.1", "--http-port", str(http),
                             "--grpc-port", str(grpc), "--contexts", "2", "--batch-delay-ms", "1"],
                            stdout=log, stderr=subprocess.STDOUT)
    deadline = time.time() + 60
    while True:
        try:
            if json.loads(http_get(f"http://127.0.0.1:{http}/v2/health/ready")).get("ready"):
                return proc, http, grpc
        except (urllib.error.URLError, ConnectionError, OSError, ValueError):
            pass
        if proc.poll() is not None or time.time() > deadline:
            proc.kill()
            log.seek(0)
            raise RuntimeError(f"kiln serve did not start:\n{log.read()[-3000:]}")
        time.sleep(0.2)


def perf_regions():
    return set(glob.glob("/dev/shm/kiln_perf_*"))


class Perf:
    def __init__(self, kiln, http, grpc, d):
        self.kiln, self.http, self.grpc, self.d = kiln, http, grpc, d
        self.n = 0

    def url_args(self, proto):
        port = self.grpc if proto == "grpc" else self.http
        return ["-i", proto, "-u", f"127.0.0.1:{port}", "--metrics-url", f"127.0.0.1:{self.http}"]

    def run(self, *args, timeout=120):
        return subprocess.run([self.kiln, "perf", *args], capture_output=True, text=True,
                              timeout=timeout)

    def measure(self, label, proto, *args):
        """Runs kiln perf with JSON and CSV reports; returns (json, csv rows) or None."""
        self.n += 1
        js, cs = os.path.join(self.d, f"r{self.n}.json"), os.path.join(self.d, f"r{self.n}.csv")
        before = perf_regions()
        p = self.run("-m", "mlp", *self.url_args(proto), "--json", js, "-f", cs, *args)
        if not check(f"{label}: exit 0", p.returncode == 0, p.stderr.strip()):
            return None
        check(f"{label}: nothing on stderr", p.stderr == "", p.stderr.strip())
        check(f"{label}: the table on stdout", "infer/sec" in p.stdout and "p99 us" in p.stdout,
              p.stdout)
        check(f"{label}: no region left in /dev/shm", perf_regions() <= before,
              str(perf_regions() - before))
        status = json.loads(http_get(f"http://127.0.0.1:{self.http}/v2/systemsharedmemory/status"))
        check(f"{label}: no region left registered", status == [], str(status))
        with open(js) as f:
            report = json.load(f)
        with open(cs) as f:
            rows = list(csv.DictReader(f))
        return report, rows


def check_levels(label, report, rows, levels, batch, max_requests=None, key="concurrency"):
    results = report["results"]
    check(f"{label}: levels {levels}", [r[key] for r in results] == levels,
          str([r[key] for r in results]))
    check(f"{label}: CSV rows", [float(r["Concurrency" if key == "concurrency" else "Request Rate"])
                                 for r in rows] == levels and
          [int(r["Requests"]) for r in rows] == [r["requests"] for r in results], str(rows))
    for r in results:
        at = f"{label} @{r[key]}"
        lat = r["latency_us"]
        check(f"{at}: requests answered, none failed", r["requests"] > 0 and r["errors"] == 0,
              f"{r['requests']} requests, {r['errors']} errors {r['error_messages']}")
        if max_requests:
            check(f"{at}: --max-requests bounds the level", r["requests"] + r["errors"] <= max_requests,
                  str(r["requests"]))
        order = [lat["min"], lat["p50"], lat["p90"], lat["p95"], lat["p99"], lat["max"]]
        check(f"{at}: percentiles in order", order == sorted(order) and order[0] > 0, str(lat))
        want = r["requests"] * batch / r["duration_s"]
        check(f"{at}: throughput = requests x batch / duration",
              abs(r["throughput_infer_per_s"] - want) <= 1e-6 * want, f"{r['throughput_infer_per_s']} vs {want}")
        s = r["server"]
        if not check(f"{at}: server counters read", s is not None, report["server_counters"]):
            continue
        formed = s["batch_inferences"]
        check(f"{at}: the server took every request sent", s["requests"] == r["requests"],
              f"server {s['requests']}, client {r['requests']}")
        check(f"{at}: samples = requests x batch", s["samples"] == r["requests"] * batch, str(s))
        check(f"{at}: inferences = the batches formed",
              1 <= s["inferences"] <= s["requests"] and sum(formed.values()) == s["inferences"],
              str(s))
        check(f"{at}: batch sizes add up to the samples",
              sum(int(b) * n for b, n in formed.items()) == s["samples"] + s["padded_samples"], str(s))
        check(f"{at}: queue and compute times", s["queue_us_per_request"] >= 0 and
              s["compute_us_per_inference"] > 0 and s["failed"] == 0, str(s))
        check(f"{at}: average batch", abs(s["avg_batch"] - s["samples"] / s["inferences"]) < 1e-9,
              str(s))


def expect_error(perf, label, needle, *args):
    p = perf.run(*args)
    lines = p.stderr.strip().splitlines()
    problems = []
    if p.returncode != 1:
        problems.append(f"exit status {p.returncode}")
    if len(lines) != 1:
        problems.append(f"{len(lines)} stderr lines")
    if needle.lower() not in p.stderr.lower():
        problems.append(f"message lacks '{needle}'")
    check(f"{label}: {lines[-1] if lines else '(no message)'}", not problems, "; ".join(problems))


def interrupt_case(perf):
    """SIGINT in the middle of a level: the level measured so far is reported, every region is
    unregistered and unlinked, exit status 1 with one line."""
    js = os.path.join(perf.d, "interrupted.json")
    before = perf_regions()
    p = subprocess.Popen([perf.kiln, "perf", "-m", "mlp", *perf.url_args("http"),
                          "--shared-memory", "system", "--concurrency-range", "2:4", "-p", "20000",
                          "--json", js], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 20
    while len(perf_regions() - before) < 2 and time.time() < deadline and p.poll() is None:
        time.sleep(0.05)
    time.sleep(0.3)
    p.send_signal(signal.SIGINT)
    try:
        _, err = p.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        p.kill()
        check("SIGINT: kiln perf stops", False, "still running 30 s after SIGINT")
        return
    check("SIGINT: exit 1 with one line", p.returncode == 1 and len(err.strip().splitlines()) == 1
          and "interrupted" in err, f"{p.returncode}: {err.strip()}")
    check("SIGINT: no region left in /dev/shm", perf_regions() <= before,
          str(perf_regions() - before))
    status = json.loads(http_get(f"http://127.0.0.1:{perf.http}/v2/systemsharedmemory/status"))
    check("SIGINT: no region left registered", status == [], str(status))
    with open(js) as f:
        report = json.load(f)
    check("SIGINT: the report says so and holds the level measured",
          report["stopped"] == "interrupted" and len(report["results"]) == 1 and
          report["results"][0]["requests"] > 0, json.dumps(report)[:300])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kiln", default="build/kiln")
    args = ap.parse_args()
    kiln = os.path.abspath(args.kiln)
    start = time.time()
    with tempfile.TemporaryDirectory() as d:
        repo = make_repository(kiln, d)
        proc, http, grpc = start_server(kiln, repo, os.path.join(d, "serve.log"))
        perf = Perf(kiln, http, grpc, d)
        try:
            sweep = ["--concurrency-range", "1:4:x2", "-p", "300", "--max-requests", "400"]
            for proto in ("http", "grpc"):
                for shm in ("none", "system"):
                    label = f"{proto}, shared memory {shm}"
                    out = perf.measure(label, proto, "--shared-memory", shm, *sweep)
                    if out:
                        check_levels(label, *out, [1, 2, 4], 1, max_requests=400)
                        check(f"{label}: the JSON names the run",
                              out[0]["protocol"] == proto and out[0]["shared_memory"] == shm and
                              out[0]["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [1, 64]}],
                              json.dumps(out[0])[:300])
            out = perf.measure("gRPC, shared memory, batch 4", "grpc", "--shared-memory", "system",
                               "-b", "4", "--concurrency-range", "2", "-p", "300")
            if out:
                check_levels("gRPC, shared memory, batch 4", *out, [2], 4)
            out = perf.measure("HTTP, request rate", "http", "--request-rate-range", "100:200:100",
                               "-p", "400", "--max-threads", "4")
            if out:
                check_levels("HTTP, request rate", *out, [100, 200], 1, key="request_rate")
                for r in out[0]["results"]:
                    check(f"HTTP, request rate @{r['request_rate']}: at most the rate's requests",
                          r["requests"] <= r["request_rate"] * 0.4 + 1, str(r["requests"]))
            # A dynamic dim past the batch, given with --shape.
            p = perf.run("-m", "seq", *perf.url_args("http"), "--shape", "x:16", "-p", "200",
                         "--json", "-")
            if check("--shape: exit 0", p.returncode == 0, p.stderr.strip()):
                rep = json.loads(p.stdout)
                check("--shape: the input's shape", rep["inputs"][0]["shape"] == [1, 16] and
                      rep["results"][0]["requests"] > 0 and rep["results"][0]["errors"] == 0,
                      json.dumps(rep)[:300])
            # perf_analyzer's JSON input data: the shape past the batch from the file, one
            # sample repeated over the batch.
            data = os.path.join(d, "seq.json")
            with open(data, "w") as f:
                json.dump({"data": [{"x": {"content": [1, 2, 3, 4, 5], "shape": [5]}}]}, f)
            p = perf.run("-m", "seq", *perf.url_args("grpc"), "--input-data", data, "-b", "3",
                         "-p", "200", "--json", "-")
            if check("--input-data JSON: exit 0", p.returncode == 0, p.stderr.strip()):
                rep = json.loads(p.stdout)
                check("--input-data JSON: the input's shape", rep["inputs"][0]["shape"] == [3, 5] and
                      rep["results"][0]["requests"] > 0 and rep["results"][0]["errors"] == 0,
                      json.dumps(rep)[:300])
            # The time limit ends a sweep early, with the levels measured reported.
            p = perf.run("-m", "mlp", *perf.url_args("grpc"), "--concurrency-range", "1:8",
                         "-p", "400", "--time-limit", "1", "--json", "-")
            if check("--time-limit: exit 0", p.returncode == 0, p.stderr.strip()):
                rep = json.loads(p.stdout)
                check("--time-limit: the sweep stops early", len(rep["results"]) <= 3 and
                      "time limit" in (rep["stopped"] or ""), json.dumps(rep)[:300])
                check("--time-limit: one warning line", len(p.stderr.strip().splitlines()) == 1,
                      p.stderr)
            interrupt_case(perf)

            nobody = free_port()
            h, g = perf.url_args("http"), perf.url_args("grpc")
            expect_error(perf, "unknown model (HTTP)", "unknown model 'nope'", "-m", "nope", *h)
            expect_error(perf, "unknown model (gRPC)", "unknown model 'nope'", "-m", "nope", *g)
            expect_error(perf, "server not up (HTTP)", "is the server up", "-m", "mlp", "-u",
                         f"127.0.0.1:{nobody}")
            expect_error(perf, "server not up (gRPC)", "is the server up", "-m", "mlp", "-i", "grpc",
                         "-u", f"127.0.0.1:{nobody}")
            expect_error(perf, "remote URL", "--allow-remote", "-m", "mlp", "-u", "192.0.2.1:8080")
            expect_error(perf, "remote metrics URL", "--allow-remote", "-m", "mlp", *h[:4],
                         "--metrics-url", "example.com:8080")
            expect_error(perf, "bad protocol", "-i takes grpc or http", "-m", "mlp", "-i", "udp")
            expect_error(perf, "bad concurrency range", "--concurrency-range", "-m", "mlp",
                         "--concurrency-range", "4:1")
            expect_error(perf, "bad request rate", "--request-rate-range", "-m", "mlp",
                         "--request-rate-range", "0")
            expect_error(perf, "both load modes", "exclude each other", "-m", "mlp",
                         "--concurrency-range", "2", "--request-rate-range", "10")
            expect_error(perf, "bad shared memory kind", "--shared-memory", "-m", "mlp",
                         "--shared-memory", "cuda")
            expect_error(perf, "dynamic dims without --shape", "--shape x:", "-m", "seq", *h)
            expect_error(perf, "--shape of an unknown input", "no such input", "-m", "seq", *h,
                         "--shape", "z:4")
            expect_error(perf, "--shape of the wrong rank", "1 past the batch", "-m", "seq", *h,
                         "--shape", "x:4,4")
            expect_error(perf, "a batch over the server's maximum", "first request failed",
                         "-m", "mlp", *g, "-b", "16")
            expect_error(perf, "bad --input-data", "--input-data", "-m", "mlp", *h,
                         "--input-data", os.path.join(d, "nope"))
            expect_error(perf, "missing --model-name", "--model-name", *h)
            expect_error(perf, "bad --batch-size", "--batch-size", "-m", "mlp", "-b", "0")
            check("after the bad input: no region left in /dev/shm or registered",
                  json.loads(http_get(f"http://127.0.0.1:{http}/v2/systemsharedmemory/status")) == [])
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                check("kiln serve stops on SIGTERM", False)
    print(f"kiln perf tests: {len(FAILURES)} failed, {time.time() - start:.0f} s")
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
