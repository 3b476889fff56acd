#!/usr/bin/env bash
# The wheels bench/serve_load.py needs on the GPU machine that its image lacks (Triton's clients,
# tritonclient[http,grpc], and their dependencies; it has numpy, pandas, pillow, ml_dtypes,
# uvloop, aiohttp, pyyaml, psutil, prometheus-client, httpx, requests, matplotlib, torch), for
# CPython 3.12 manylinux x86_64, into .whl/ (git-ignored; carry it). `kiln serve` itself is the
# C++ server and needs none. bench/serve_gpu.sh installs them with pip --no-index --no-deps
# into /tmp/site. (The list was checked complete by importing tritonclient.grpc, .http and
# .utils.shared_memory in a virtual environment of the image's packages and these alone.)
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .whl
PLAT=()
for p in manylinux_2_34 manylinux_2_31 manylinux_2_28 manylinux_2_27 manylinux_2_24 manylinux_2_17 \
         manylinux2014 manylinux_2_5 manylinux1; do PLAT+=(--platform "${p}_x86_64"); done
WHEELS="tritonclient==2.73.0 python-rapidjson==1.25 grpcio==1.85.3 protobuf==6.33.6
gevent==26.9.0 geventhttpclient==2.6.1 greenlet==3.3.2 zope.event==6.2 zope.interface==8.7
brotli==1.2.1"
for w in $WHEELS; do
  name=${w%%==*}
  if ls .whl | grep -qi "^$(echo "${name//-/_}" | sed 's/\./_/g')-${w##*==}-"; then continue; fi
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp "${PLAT[@]}" -d .whl "$w"
done
du -sh .whl
