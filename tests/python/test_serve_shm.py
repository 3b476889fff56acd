"""`kiln serve` and Triton's system shared memory extension (src/serve/shm.*; of the CUDA one,
the registrations), on the cpu backend, driven by tritonclient's own shared-memory helpers over
gRPC and HTTP: inputs read from and outputs written into registered regions equal the engine run
directly, the registration endpoints answer as Triton's, each bad use is a 4xx naming the
problem, and a region registered through one connection is used, and unregistered, through
others. Localhost only; every loop bounded."""
import base64
import json
import os
import subprocess
import sys
import threading
import urllib.error
import urllib.request

import numpy as np
import pytest
from conftest import free_port, serve_env, serve_repo, stop_serve, wait_ready

import kiln

httpclient = pytest.importorskip("tritonclient.http", reason="tritonclient is not installed "
                                 "(scripts/setup.sh installs it)")
grpcclient = pytest.importorskip("tritonclient.grpc")
shmlib = pytest.importorskip("tritonclient.utils.shared_memory")
if not os.path.isdir("/dev/shm"):
    pytest.skip("no /dev/shm (POSIX shared memory) here", allow_module_level=True)

from tritonclient.utils import InferenceServerException  # noqa: E402

CNN_IN = 3 * 32 * 32 * 4  # bytes of one small_cnn sample
CNN_OUT = 10 * 4


@pytest.fixture(scope="module")
def repo(models_dir, tmp_path_factory):
    return serve_repo(models_dir, tmp_path_factory.mktemp("repo"), max_batch=8)


@pytest.fixture(scope="module")
def server(repo, tmp_path_factory):
    http, grpc_port = free_port(), free_port()
    log = open(tmp_path_factory.mktemp("log") / "serve.log", "w+")
    proc = subprocess.Popen(
        [sys.executable, "-m", "kiln.cli", "serve", str(repo), "--host", "127.0.0.1",
         "--http-port", str(http), "--grpc-port", str(grpc_port), "--contexts", "1",
         "--batch-delay-ms", "20"], stdout=log, stderr=subprocess.STDOUT, env=serve_env())
    wait_ready(proc, f"127.0.0.1:{http}", log)
    yield {"http": f"127.0.0.1:{http}", "grpc": f"127.0.0.1:{grpc_port}", "proc": proc,
           "log": log}
    stop_serve(proc)


@pytest.fixture(scope="module")
def engine(repo):
    return kiln.load(str(repo / "small_cnn.kiln")).create_context()


class Regions:
    """Shared memory objects made with tritonclient's helpers, each destroyed at the end."""

    def __init__(self):
        self.handles, self.n = [], 0

    def make(self, byte_size, data=None, offset=0):
        self.n += 1
        key = f"/kiln_test_{os.getpid()}_{threading.get_ident()}_{self.n}"
        h = shmlib.create_shared_memory_region(key.lstrip("/"), key, byte_size)
        self.handles.append(h)
        if data is not None:
            shmlib.set_shared_memory_region(h, [data], offset=offset)
        return h, key

    def destroy(self):
        for h in self.handles:
            shmlib.destroy_shared_memory_region(h)
        self.handles = []


@pytest.fixture
def regions():
    r = Regions()
    yield r
    r.destroy()


def client(proto, server, **kw):
    mod = httpclient if proto == "http" else grpcclient
    return mod, mod.InferenceServerClient(server[proto], **kw)


def cnn_input(batch, seed):
    return np.random.default_rng(seed).standard_normal((batch, 3, 32, 32)).astype(np.float32)


def shm_infer(mod, c, x, in_region, out_region, in_offset=0, out_size=None, model="small_cnn"):
    inp = mod.InferInput("input", list(x.shape), "FP32")
    inp.set_shared_memory(in_region, x.nbytes, offset=in_offset)
    out = mod.InferRequestedOutput("probabilities")
    out.set_shared_memory(out_region, out_size if out_size is not None else x.shape[0] * CNN_OUT)
    return c.infer(model, [inp], outputs=[out])


def names(status):
    """Region names of a status answer (HTTP: a JSON list; gRPC: the message)."""
    if isinstance(status, list):
        return sorted(r["name"] for r in status)
    return sorted(status.regions)


@pytest.mark.parametrize("proto", ["grpc", "http"])
def test_round_trip_equals_the_engine(server, engine, regions, proto):
    """Input and output in shared memory (the input at an offset, in a region at an offset of
    its object), the input alone in shared memory, status and unregister, as tritonclient's
    shared-memory examples use them."""
    mod, c = client(proto, server)
    c.unregister_system_shared_memory()
    x = cnn_input(3, 1)
    want = np.asarray(engine.run({"input": x})["probabilities"])
    h_in, key_in = regions.make(256 + x.nbytes, x, offset=256)
    h_out, key_out = regions.make(CNN_OUT * 8)
    c.register_system_shared_memory(f"{proto}_in", key_in, x.nbytes + 128, offset=128)
    c.register_system_shared_memory(f"{proto}_out", key_out, CNN_OUT * 8)
    assert names(c.get_system_shared_memory_status()) == [f"{proto}_in", f"{proto}_out"]
    one = c.get_system_shared_memory_status(f"{proto}_in")
    one = one[0] if isinstance(one, list) else one.regions[f"{proto}_in"]
    got = {k: (one[k] if isinstance(one, dict) else getattr(one, k))
           for k in ("name", "key", "offset", "byte_size")}
    assert got == {"name": f"{proto}_in", "key": key_in, "offset": 128,
                   "byte_size": x.nbytes + 128}

    r = shm_infer(mod, c, x, f"{proto}_in", f"{proto}_out", in_offset=128)
    o = r.get_output("probabilities")
    shape = list(o["shape"] if proto == "http" else o.shape)
    datatype = o["datatype"] if proto == "http" else o.datatype
    assert shape == [3, 10] and datatype == "FP32"
    if proto == "http":
        assert "data" not in o
    else:  # empty raw contents, as Triton answers
        assert r.get_response().raw_output_contents == [b""]
    got = shmlib.get_contents_as_numpy(h_out, np.float32, shape)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)

    # the input alone in shared memory; the output in the response
    inp = mod.InferInput("input", list(x.shape), "FP32")
    inp.set_shared_memory(f"{proto}_in", x.nbytes, offset=128)
    got = c.infer("small_cnn", [inp]).as_numpy("probabilities")
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)

    c.unregister_system_shared_memory(f"{proto}_in")
    assert names(c.get_system_shared_memory_status()) == [f"{proto}_out"]
    c.unregister_system_shared_memory()
    assert names(c.get_system_shared_memory_status()) == []


def test_server_metadata_names_the_extension(server):
    with urllib.request.urlopen(f"http://{server['http']}/v2", timeout=10) as r:
        assert "system_shared_memory" in json.loads(r.read())["extensions"]
    _, c = client("grpc", server)
    assert "system_shared_memory" in c.get_server_metadata().extensions


def test_concurrent_shared_memory_clients_are_batched(server, repo):
    """Clients with their own regions at once, over both protocols, through the dynamic
    batcher: each gets its own sample's outputs in its own region."""
    ctx = kiln.load(str(repo / "small_cnn.kiln")).create_context()
    n, errors, results = 8, [], {}
    xs = [cnn_input(1, 50 + i) for i in range(n)]
    want = np.asarray(ctx.run({"input": np.concatenate(xs)})["probabilities"])
    barrier = threading.Barrier(n)

    def one(i):
        own = Regions()
        try:
            proto = "grpc" if i % 2 else "http"
            mod, c = client(proto, server)
            h_in, key_in = own.make(CNN_IN, xs[i])
            h_out, key_out = own.make(CNN_OUT)
            c.register_system_shared_memory(f"c{i}_in", key_in, CNN_IN)
            c.register_system_shared_memory(f"c{i}_out", key_out, CNN_OUT)
            barrier.wait(timeout=60)
            shm_infer(mod, c, xs[i], f"c{i}_in", f"c{i}_out")
            results[i] = shmlib.get_contents_as_numpy(h_out, np.float32, [1, 10]).copy()
            c.unregister_system_shared_memory(f"c{i}_in")
            c.unregister_system_shared_memory(f"c{i}_out")
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)
            barrier.abort()
        finally:
            own.destroy()

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    for i in range(n):
        np.testing.assert_allclose(results[i], want[i:i + 1], rtol=1e-5, atol=1e-6)


# ---- bad uses: a 4xx (gRPC: a client error) naming the problem --------------------------------
def rest(server, method, path, body=None):
    req = urllib.request.Request(f"http://{server['http']}{path}", method=method,
                                 data=json.dumps(body).encode() if body is not None else None,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def infer_body(inp_params=None, out_params=None, data=False, shape=(1, 3, 32, 32)):
    t = {"name": "input", "shape": list(shape), "datatype": "FP32"}
    if inp_params is not None:
        t["parameters"] = inp_params
    if data:
        t["data"] = [0.0] * int(np.prod(shape))
    body = {"inputs": [t]}
    if out_params is not None:
        body["outputs"] = [{"name": "probabilities", "parameters": out_params}]
    return body


def region(name, size, offset=None):
    p = {"shared_memory_region": name, "shared_memory_byte_size": size}
    if offset is not None:
        p["shared_memory_offset"] = offset
    return p


@pytest.fixture
def bad_setup(server, regions):
    """Regions 'in' (one sample) and 'out' (one output) registered; unregistered after."""
    _, c = client("http", server)
    c.unregister_system_shared_memory()
    _, key_in = regions.make(CNN_IN, cnn_input(1, 0))
    _, key_out = regions.make(CNN_OUT)
    c.register_system_shared_memory("in", key_in, CNN_IN)
    c.register_system_shared_memory("out", key_out, CNN_OUT)
    yield {"in": key_in, "out": key_out}
    c.unregister_system_shared_memory()


BAD_INFERS = [  # (request body, message)
    (infer_body(region("nosuch", CNN_IN)), "unknown shared memory region 'nosuch'"),
    (infer_body(region("in", CNN_IN, 4)),
     "input 'input': shared_memory_offset 4 + shared_memory_byte_size 12288 is beyond shared "
     "memory region 'in' of 12288 bytes"),
    (infer_body(region("in", 100)),
     "input 'input': shared_memory_byte_size 100, shape [1, 3, 32, 32] of FP32 takes 12288"),
    (infer_body(region("in", CNN_IN), data=True),
     "input 'input': both data and shared_memory_region given"),
    (infer_body(region("in", CNN_IN), region("out", 8)),
     "output 'probabilities': shared_memory_byte_size 8 of region 'out' is too small for shape "
     "[1, 10] of FP32, which takes 40 bytes"),
    (infer_body(region("in", CNN_IN), region("nosuch", 40)),
     "unknown shared memory region 'nosuch'"),
    (infer_body({"shared_memory_region": "in"}), "shared_memory_region given without "
     "shared_memory_byte_size"),
    (infer_body(region("in", -1)), "shared_memory_byte_size -1 is not a whole number"),
]


@pytest.mark.parametrize("body, message", BAD_INFERS)
def test_bad_rest_inferences(server, bad_setup, body, message):
    status, text = rest(server, "POST", "/v2/models/small_cnn/infer", body)
    assert status == 400, text
    assert message in json.loads(text)["error"], text


def grpc_bad(c, x, inp_region=None, out_region=None, contents=False):
    inp = grpcclient.InferInput("input", list(x.shape), "FP32")
    if contents:
        inp.set_data_from_numpy(x)
    if inp_region is not None:
        inp.set_shared_memory(*inp_region)
        if contents:  # set_shared_memory drops the data: put it back, as a buggy client might
            inp._raw_content = x.tobytes()
    outputs = None
    if out_region is not None:
        out = grpcclient.InferRequestedOutput("probabilities")
        out.set_shared_memory(*out_region)
        outputs = [out]
    with pytest.raises(InferenceServerException) as e:
        c.infer("small_cnn", [inp], outputs=outputs)
    return e.value


@pytest.mark.parametrize("kwargs, message", [
    (dict(inp_region=("nosuch", CNN_IN)), "unknown shared memory region 'nosuch'"),
    (dict(inp_region=("in", CNN_IN, 4)), "is beyond shared memory region 'in' of 12288 bytes"),
    (dict(inp_region=("in", 100)), "shared_memory_byte_size 100, shape [1, 3, 32, 32] of FP32 "
                                    "takes 12288"),
    (dict(inp_region=("in", CNN_IN), contents=True),
     "input 'input': both raw_input_contents and shared_memory_region given"),
    (dict(inp_region=("in", CNN_IN), out_region=("out", 8)),
     "output 'probabilities': shared_memory_byte_size 8 of region 'out' is too small"),
])
def test_bad_grpc_inferences(server, bad_setup, kwargs, message):
    _, c = client("grpc", server)
    e = grpc_bad(c, cnn_input(1, 0), **kwargs)
    assert e.status() == "StatusCode.INVALID_ARGUMENT" and message in e.message(), e


def test_a_symbolic_link_in_dev_shm_is_not_followed(server, tmp_path):
    """As shm_open(3): a link in /dev/shm could otherwise aim the server's output writes at any
    file its user may write."""
    target = tmp_path / "not_shared_memory"
    target.write_bytes(b"\0" * 4096)
    link = os.path.join("/dev/shm", f"kiln_test_link_{os.getpid()}")
    os.symlink(target, link)
    try:
        status, text = rest(server, "POST", "/v2/systemsharedmemory/region/link/register",
                            {"key": os.path.basename(link), "offset": 0, "byte_size": 64})
    finally:
        os.unlink(link)
    assert status == 400, text
    assert "cannot open shared memory object" in json.loads(text)["error"], text


def test_a_shrunk_object_is_refused_not_a_crash(server, bad_setup):
    """A client that truncates its object after registering it: reading the mapping past the
    new end would fault (SIGBUS) and kill the server; it is a 400, and the server lives on."""
    os.truncate(os.path.join("/dev/shm", bad_setup["in"].lstrip("/")), 16)
    status, text = rest(server, "POST", "/v2/models/small_cnn/infer",
                        infer_body(region("in", CNN_IN), region("out", CNN_OUT)))
    assert status == 400, text
    assert "is now 16 bytes, under the 12288 it was registered with" in json.loads(text)["error"]
    status, text = rest(server, "GET", "/v2/health/live")
    assert status == 200, text


def b64(n):
    """A CUDA IPC handle of n zero bytes as Triton's clients take one (base64 text)."""
    return base64.b64encode(b"\0" * n).decode()


@pytest.mark.parametrize("proto", ["grpc", "http"])
def test_bad_registrations(server, bad_setup, regions, proto):
    _, c = client(proto, server)
    cases = [
        (lambda: c.register_system_shared_memory("in", bad_setup["out"], 8),
         "StatusCode.ALREADY_EXISTS", 409, "shared memory region 'in' is already registered"),
        (lambda: c.register_system_shared_memory("x", "/kiln_test_no_such_key", 8),
         "StatusCode.INVALID_ARGUMENT", 400, "shared memory key '/kiln_test_no_such_key': no "
                                             "such object"),
        (lambda: c.register_system_shared_memory("x", bad_setup["out"], 40, offset=8),
         "StatusCode.INVALID_ARGUMENT", 400, "offset 8 + byte_size 40 is beyond object"),
        (lambda: c.register_system_shared_memory("x", "../etc/passwd", 8),
         "StatusCode.INVALID_ARGUMENT", 400, "is not the name of a POSIX shared memory object"),
        (lambda: c.get_system_shared_memory_status("nosuch"),
         "StatusCode.NOT_FOUND", 404, "no shared memory region 'nosuch' is registered"),
        # a handle of zeros opens nowhere (and this machine may have no device: said so)
        (lambda: c.register_cuda_shared_memory("gpu", b64(64), 0, 64),
         "StatusCode.INVALID_ARGUMENT", 400, "CUDA shared memory region 'gpu': "),
        (lambda: c.register_cuda_shared_memory("gpu", b64(10), 0, 64),
         "StatusCode.INVALID_ARGUMENT", 400, "raw_handle holds 10 bytes; a CUDA IPC handle"),
        (lambda: c.register_cuda_shared_memory("in", b64(64), 0, 64),
         "StatusCode.ALREADY_EXISTS", 409, "shared memory region 'in' is already registered"),
        (lambda: c.get_cuda_shared_memory_status("nosuch"),
         "StatusCode.NOT_FOUND", 404, "no CUDA shared memory region 'nosuch' is registered"),
    ]
    for call, grpc_status, http_status, message in cases:
        with pytest.raises(InferenceServerException) as e:
            call()
        assert message in e.value.message(), e.value
        if proto == "grpc":
            assert e.value.status() == grpc_status, e.value
        else:
            assert e.value.status() in (None, str(http_status)), e.value
    # the HTTP statuses themselves, and malformed bodies
    for method, path, body, status, message in [
        ("POST", "/v2/systemsharedmemory/region/in/register",
         {"key": bad_setup["out"], "byte_size": 8}, 409, "already registered"),
        ("GET", "/v2/systemsharedmemory/region/nosuch/status", None, 404, "nosuch"),
        ("POST", "/v2/systemsharedmemory/region/x/register", {"key": bad_setup["out"]}, 400,
         '"key" and "byte_size"'),
        ("POST", "/v2/systemsharedmemory/region/x/register",
         {"key": bad_setup["out"], "byte_size": "8"}, 400, "byte_size '8' is not a whole number"),
        ("GET", "/v2/systemsharedmemory/region/x/register", None, 405, "takes POST"),
        ("POST", "/v2/cudasharedmemory/region/x/register", {}, 400, '"raw_handle": {"b64"'),
        ("POST", "/v2/cudasharedmemory/region/x/register",
         {"raw_handle": {"b64": "*"}, "device_id": 0, "byte_size": 8}, 400, "is not base64"),
        ("POST", "/v2/cudasharedmemory/region/x/register",
         {"raw_handle": {"b64": "AAAA"}, "device_id": -1, "byte_size": 8}, 400,
         "device_id -1 is not a device number"),
    ]:
        got, text = rest(server, method, path, body)
        assert got == status and message in json.loads(text)["error"], (path, got, text)
    assert names(c.get_system_shared_memory_status()) == ["in", "out"]
    assert names(c.get_cuda_shared_memory_status()) == []  # the system regions are not CUDA ones
    assert server["proc"].poll() is None


def test_registrations_hold_across_connections(server, engine, regions):
    """Registered through one connection, used through new ones (gRPC and HTTP); unregistered
    through one, unknown to all; registered again under the same name with another object, the
    new object's contents through every connection (no stale mapping); a name registered twice
    is refused."""
    _, c = client("http", server)
    c.unregister_system_shared_memory()
    try:
        x = cnn_input(2, 7)
        want = np.asarray(engine.run({"input": x})["probabilities"])
        h_in, key_in = regions.make(x.nbytes, x)
        h_out, key_out = regions.make(2 * CNN_OUT)
        c.register_system_shared_memory("in", key_in, x.nbytes)
        c.register_system_shared_memory("out", key_out, 2 * CNN_OUT)

        def fresh(proto):  # a new connection
            if proto == "grpc":
                return client(proto, server,
                              channel_args=[("grpc.use_local_subchannel_pool", 1)])
            return client(proto, server)

        for i in range(8):
            mod, cc = fresh("grpc" if i % 2 else "http")
            shmlib.set_shared_memory_region(h_out, [np.zeros((2, 10), np.float32)])
            shm_infer(mod, cc, x, "in", "out")
            got = shmlib.get_contents_as_numpy(h_out, np.float32, [2, 10])
            np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
            cc.close()

        c.unregister_system_shared_memory("in")
        for i in range(4):
            mod, cc = fresh("grpc" if i % 2 else "http")
            with pytest.raises(InferenceServerException, match="unknown shared memory region 'in'"):
                shm_infer(mod, cc, x, "in", "out")
            assert names(cc.get_system_shared_memory_status()) == ["out"]
            cc.close()

        y = cnn_input(2, 8)
        want_y = np.asarray(engine.run({"input": y})["probabilities"])
        _, key_y = regions.make(y.nbytes, y)
        c.register_system_shared_memory("in", key_y, y.nbytes)
        for i in range(4):
            mod, cc = fresh("grpc" if i % 2 else "http")
            shm_infer(mod, cc, y, "in", "out")
            got = shmlib.get_contents_as_numpy(h_out, np.float32, [2, 10])
            np.testing.assert_allclose(got, want_y, rtol=1e-6, atol=1e-7)
            cc.close()
        with pytest.raises(InferenceServerException, match="already registered"):
            fresh("grpc")[1].register_system_shared_memory("in", key_in, x.nbytes)
    finally:
        c.unregister_system_shared_memory()
    assert server["proc"].poll() is None
