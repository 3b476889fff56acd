#!/usr/bin/env bash
# The wheels `kiln serve` and bench/serve_load.py need on the GPU machine that its image lacks
# (kserve, tritonclient and their dependencies; it has numpy, pandas, pillow, ml_dtypes, uvloop,
# aiohttp, pyyaml, psutil, prometheus-client, httpx, requests, matplotlib, torch), for CPython
# 3.12 manylinux x86_64, into .whl/ (git-ignored; about 35 MB; carry it). grpcio and protobuf are
# carried at the versions kserve's generated code was made with. bench/serve_gpu.sh installs
# them with pip --no-index --no-deps into /tmp/site.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .whl
PLAT=()
for p in manylinux_2_34 manylinux_2_31 manylinux_2_28 manylinux_2_27 manylinux_2_24 manylinux_2_17 \
         manylinux2014 manylinux_2_5 manylinux1; do PLAT+=(--platform "${p}_x86_64"); done
WHEELS="kserve==0.21.0 kubernetes==37.0.1 cryptography==50.0.2 cffi==2.0.0 pycparser==3.12
grpcio==1.85.3 grpcio-tools==1.81.1 grpcio-reflection==1.81.1 grpc-interceptor==0.15.4
protobuf==6.33.6 googleapis-common-protos==1.76.0 pydantic==2.14.4 pydantic_core==2.50.5
annotated-types==0.7.0 typing-inspection==0.4.5 fastapi==0.165.0 starlette==1.10.0
uvicorn==0.54.0 httptools==0.9.0 watchfiles==1.3.0 websockets==17.4 cloudevents==1.13.0
deprecation==2.1.0 durationpy==0.11 google-auth==2.63.0 google-api-core==2.44.0 oauthlib==4.0.1
requests-oauthlib==2.0.0 orjson==3.13.0 python-multipart==0.0.34 timing-asgi==0.3.2
websocket-client==1.9.2 opentelemetry-api==1.45.2 opentelemetry-sdk==1.45.2
opentelemetry-semantic-conventions==0.66b2 opentelemetry-exporter-prometheus==0.66b2
opentelemetry-proto==1.45.2 sniffio==1.3.1 blinker==1.9.0 brotli==1.2.1 wcwidth==0.7.0
tritonclient==2.73.0 python-rapidjson==1.25 gevent==26.9.0 geventhttpclient==2.6.1
greenlet==3.3.2 zope.event==6.2 zope.interface==8.7"
for w in $WHEELS; do
  name=${w%%==*}
  if ls .whl | grep -qi "^$(echo "${name//-/_}" | sed 's/\./_/g')-${w##*==}-"; then continue; fi
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp "${PLAT[@]}" -d .whl "$w"
done
du -sh .whl
