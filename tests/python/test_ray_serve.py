"""kiln on Ray Serve: two replicas on one machine (local Ray on 127.0.0.1, CPU backend) serve
concurrent v2 requests, both replicas answer, and everything shuts down cleanly."""
import importlib.util
import json
import os
import socket
import threading
import urllib.request

import numpy as np
import pytest
from conftest import ort_outputs, rel_l2

import kiln

if importlib.util.find_spec("ray") is None or importlib.util.find_spec("kserve") is None:
    pytest.skip("ray[serve] and kserve are not installed (scripts/setup.sh installs them)",
                allow_module_level=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_replicas(models_dir, tmp_path, monkeypatch):
    # Serve gives its HTTP proxy 5 s to start and then kills it, which fails serve.start on a
    # loaded 2-core machine (CI builds the fuzzers beside these tests). The Ray processes that
    # ray.init starts inherit this environment, the controller that checks the proxy included.
    monkeypatch.setenv("RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S", "240")
    import ray
    from ray import serve
    # serve.start then waits for that proxy in this process, for a fixed 60 s (HTTP_PROXY_TIMEOUT,
    # no setting reads it); under CI's load the proxy once took longer. Wait as long as the check.
    import ray.serve._private.api as serve_api
    monkeypatch.setattr(serve_api, "HTTP_PROXY_TIMEOUT", 240, raising=False)

    from kiln.ray_serve import deployment

    repo = tmp_path / "repo"
    repo.mkdir()
    kiln.build(str(models_dir / "small_cnn.onnx"), backend="cpu",
               min_shapes={"input": [1, 3, 32, 32]}, opt_shapes={"input": [4, 3, 32, 32]},
               max_shapes={"input": [16, 3, 32, 32]}).save(repo / "small_cnn.kiln")
    port = free_port()
    # Ray's workers import kiln from where this process does.
    pkg = os.path.dirname(os.path.dirname(kiln.__file__))
    monkeypatch.setenv("PYTHONPATH",
                       os.pathsep.join(p for p in (pkg, os.environ.get("PYTHONPATH")) if p))
    ray.init(address="local", num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1",
             log_to_driver=False)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        serve.run(deployment(str(repo), num_gpus=0, num_cpus=0.5, num_replicas=2,
                             max_batch_size=8, batch_wait_timeout_s=0.02),
                  name="kiln", route_prefix="/")
        base = f"http://127.0.0.1:{port}"
        with urllib.request.urlopen(f"{base}/v2/models/small_cnn", timeout=30) as r:
            meta = json.loads(r.read())
        assert meta["inputs"][0]["shape"] == [-1, 3, 32, 32]
        n = 24
        xs = [np.random.default_rng(i).standard_normal((1, 3, 32, 32)).astype(np.float32)
              for i in range(n)]
        want = ort_outputs(models_dir / "small_cnn.onnx", {"input": np.concatenate(xs)})
        replicas, outs, errors = [None] * n, [None] * n, []

        def one(i):
            body = json.dumps({"inputs": [{"name": "input", "shape": [1, 3, 32, 32],
                                           "datatype": "FP32", "data": xs[i].ravel().tolist()}]})
            req = urllib.request.Request(f"{base}/v2/models/small_cnn/infer", data=body.encode(),
                                         headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(req, timeout=60) as r:
                    res = json.loads(r.read())
                    replicas[i] = r.headers["kiln-replica"]
                o = res["outputs"][0]
                outs[i] = np.array(o["data"], np.float32).reshape(o["shape"])
            except Exception as e:  # noqa: BLE001 - reported below
                errors.append(e)

        for _ in range(3):  # a few rounds, so that both replicas take requests
            threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout=120)
            assert not errors, errors
            for i in range(n):
                assert rel_l2(outs[i], want["probabilities"][i:i + 1]) < 1e-5
            if len(set(replicas)) == 2:
                break
        assert len(set(replicas)) == 2, set(replicas)
        bad = urllib.request.Request(f"{base}/v2/models/small_cnn/infer", data=b"{",
                                     headers={"Content-Type": "application/json"})
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(bad, timeout=30)
        assert e.value.code == 400
        # a body KServe's decoding cannot read (an input without a name) and a shape the
        # engine does not take: each a 400 with one line
        head = json.dumps({"inputs": [{"shape": [1], "datatype": "FP32",
                                       "parameters": {"binary_data_size": 4}}]}).encode()
        for body, headers, says in (
                (head + b"\0" * 4, {"Inference-Header-Content-Length": str(len(head))},
                 "malformed request: KeyError: 'name'"),
                (json.dumps({"inputs": [{"name": "input", "shape": [1, 3, 16, 16],
                                         "datatype": "FP32", "data": [0.0] * 768}]}).encode(),
                 {"Content-Type": "application/json"}, "shape [1, 3, 16, 16]")):
            req = urllib.request.Request(f"{base}/v2/models/small_cnn/infer", data=body,
                                         headers=headers)
            with pytest.raises(urllib.error.HTTPError) as e:
                urllib.request.urlopen(req, timeout=30)
            text = e.value.read().decode()
            assert e.value.code == 400 and says in json.loads(text)["error"], text
    finally:
        serve.shutdown()
        ray.shutdown()
    assert not ray.is_initialized()
