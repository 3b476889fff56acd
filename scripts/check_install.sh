#!/usr/bin/env bash
# The README's install commands as a user runs them: `pip install .`, then
# `pip install '.[serve]'`, in a fresh virtual environment with pip's default build isolation
# (pip fetches scikit-build-core, nanobind and numpy into a temporary build environment). Then,
# from outside the repository, the installed package builds and runs an engine, the installed
# `kiln` runs the C++ CLI, `kiln serve` answers one request over REST and one over gRPC, and
# KServe's predictor (`python -m kiln.kserve`, what '.[serve]' installs KServe for) starts.
#
#   scripts/check_install.sh [BUILD_DIR]
#
# With BUILD_DIR (scripts/test.sh passes the tree scripts/build.sh built), scikit-build-core
# builds in that tree (SKBUILD_BUILD_DIR) instead of a new one: the wheel is made from the objects
# already compiled, and the check fails if pip compiles any object again. The stub
# (kiln/_kiln.pyi) is removed first, so that the isolated build environment writes it again (it
# imports kiln, hence numpy). Without BUILD_DIR pip builds from scratch (about 20 minutes on 2
# cores; README.md).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
BUILD_DIR=${1:-}
WORK=${KILN_INSTALL_WORK:-${BUILD_DIR:-/tmp}/install-check}
rm -rf "$WORK"
mkdir -p "$WORK"
WORK=$(cd "$WORK" && pwd)

# The models, with the onnx package of the scripts' python3 (not needed in the user's venv).
python3 scripts/models/small_models.py "$WORK/models" >/dev/null

python3 -m venv "$WORK/venv"
# shellcheck disable=SC1091
. "$WORK/venv/bin/activate"
export PIP_DISABLE_PIP_VERSION_CHECK=1

stamp="$WORK/before-pip"
if [ -n "$BUILD_DIR" ]; then
  export SKBUILD_BUILD_DIR SKBUILD_CMAKE_BUILD_TYPE
  SKBUILD_BUILD_DIR=$(cd "$BUILD_DIR" && pwd)
  SKBUILD_CMAKE_BUILD_TYPE=${KILN_BUILD_TYPE:-Release}  # as scripts/build.sh configured it
  rm -f "$SKBUILD_BUILD_DIR/python/kiln/_kiln.pyi"
  touch "$stamp"
  sleep 1  # mtimes: an object compiled now is newer than the stamp
fi

pip_install() {  # the command as README.md writes it; its output in a log, shown on failure
  local t0=$SECONDS log="$WORK/pip-$2.log"
  # scikit-build-core clears a build tree's CMake cache and CMakeFiles/ (the objects) when its
  # last build ran from another isolated environment (.skbuild-info.json says which): each pip
  # run has a new one. This tree depends on none of them (python/CMakeLists.txt keeps nanobind's
  # and src/backends/cuda/CMakeLists.txt the CUDA headers' directories), so the record goes.
  if [ -n "$BUILD_DIR" ]; then rm -f "$SKBUILD_BUILD_DIR/.skbuild-info.json"; fi
  if ! pip install "$1" >"$log" 2>&1; then
    tail -n 60 "$log" >&2
    echo "check_install: 'pip install $1' failed (log: $log)" >&2
    exit 1
  fi
  echo "check_install: pip install $1: $((SECONDS - t0)) s"
}
echo "== pip install . and pip install '.[serve]' in a fresh virtual environment ($WORK/venv) =="
pip_install . plain
if [ -n "$BUILD_DIR" ]; then
  compiled=$(find "$SKBUILD_BUILD_DIR" -name '*.o' -newer "$stamp" | wc -l)
  linked=$(find "$SKBUILD_BUILD_DIR" -type f \( -name '*.so*' -o -perm -u+x \) -newer "$stamp" \
           -not -path '*/CMakeFiles/*' -not -path "$WORK/*" | wc -l)
  echo "check_install: pip reused $SKBUILD_BUILD_DIR: $compiled objects compiled, $linked files linked"
  if [ "$compiled" -ne 0 ]; then
    find "$SKBUILD_BUILD_DIR" -name '*.o' -newer "$stamp" | head -n 20 >&2
    echo "check_install: pip compiled objects that scripts/build.sh had built: its configuration" \
         "differs from scripts/build.sh's" >&2
    exit 1
  fi
  [ -s "$SKBUILD_BUILD_DIR/python/kiln/_kiln.pyi" ] || { echo "check_install: no stub" >&2; exit 1; }
fi
pip_install '.[serve]' serve

cd "$WORK"  # not the repository: the installed package, not python/kiln
python - "$WORK" "$ROOT" <<'PY'
import os, signal, socket, subprocess, sys, time, urllib.request

import numpy as np

import kiln

work, root = sys.argv[1], sys.argv[2]
assert kiln.__file__.startswith(sys.prefix), f"kiln from {kiln.__file__}, not the venv"
assert os.path.isfile(os.path.join(os.path.dirname(kiln.__file__), "_kiln.pyi"))

# The package: build, save, load and run an engine.
models, repo = os.path.join(work, "models"), os.path.join(work, "repo")
os.makedirs(repo)
engine = kiln.build(os.path.join(models, "small_cnn.onnx"), backend="cpu",
                    min_shapes={"input": [1, 3, 32, 32]}, opt_shapes={"input": [4, 3, 32, 32]},
                    max_shapes={"input": [8, 3, 32, 32]})
engine.save(os.path.join(repo, "small_cnn.kiln"))
x = np.random.default_rng(0).standard_normal((2, 3, 32, 32)).astype(np.float32)
want = kiln.load(os.path.join(repo, "small_cnn.kiln")).create_context().run({"input": x})
want = want["probabilities"]
assert want.shape == (2, 10) and np.allclose(want.sum(axis=1), 1, atol=1e-5), want

# The C++ CLI through the `kiln` script pip installed (kiln/bin/kiln, libkiln beside it).
exe = os.path.join(sys.prefix, "bin", "kiln")
out = subprocess.run([exe, "inspect", os.path.join(repo, "small_cnn.kiln")], check=True,
                     capture_output=True, text=True).stdout
assert "probabilities" in out, out

# kiln serve with what '.[serve]' installed, asked by Triton's clients.
def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]

http_port, grpc_port = free_port(), free_port()
log = open(os.path.join(work, "serve.log"), "w+")
proc = subprocess.Popen([exe, "serve", repo, "--host", "127.0.0.1", "--http-port", str(http_port),
                         "--grpc-port", str(grpc_port), "--contexts", "1"],
                        stdout=log, stderr=subprocess.STDOUT)
try:
    deadline = time.time() + 120
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/v2/health/ready",
                                        timeout=2) as r:
                if r.status == 200:
                    break
        except OSError:
            pass
        if proc.poll() is not None or time.time() > deadline:
            log.seek(0)
            sys.exit(f"check_install: kiln serve did not start:\n{log.read()[-4000:]}")
        time.sleep(0.5)
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient
    for mod, port in ((httpclient, http_port), (grpcclient, grpc_port)):
        client = mod.InferenceServerClient(f"127.0.0.1:{port}")
        inp = mod.InferInput("input", list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        got = client.infer("small_cnn", [inp]).as_numpy("probabilities")
        assert np.allclose(got, want, rtol=1e-5, atol=1e-6), (mod.__name__, got, want)
finally:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
# kiln.kserve with the KServe '.[serve]' installed (in a process of its own: kserve and
# tritonclient.grpc register the same protobuf messages); an empty folder is its one-line error.
empty = os.path.join(work, "no_engines")
os.makedirs(empty)
r = subprocess.run([sys.executable, "-m", "kiln.kserve", "--model_dir", empty, "--http_port",
                    str(free_port()), "--grpc_port", str(free_port())], capture_output=True,
                   text=True, timeout=300)
assert r.returncode == 1 and r.stderr.strip().startswith("kiln.kserve: error: ") \
    and "holds no engine" in r.stderr, r.stdout + r.stderr
print(f"check_install: the installed kiln {kiln.__version__} builds and runs an engine; "
      "`kiln inspect`, `kiln serve` (REST and gRPC) and `python -m kiln.kserve` work")
PY
