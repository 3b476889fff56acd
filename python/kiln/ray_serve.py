"""kiln on Ray Serve: the engines of a model repository as one deployment with the Open Inference
Protocol's (v2) REST routes, one replica per GPU, autoscaled, requests batched by Ray Serve.

Locally (one command)::

    serve run kiln.ray_serve:app_builder model_repository=models/ num_gpus=1

docs/python.md shows a cluster of several machines. Arguments of app_builder (all strings on
the command line): model_repository, num_gpus (per replica, default 1), num_replicas (fixed;
default: autoscaled between min_replicas=1 and max_replicas=4), max_batch_size (32),
batch_wait_timeout_s (0.002), contexts (execution contexts per replica, default 2).
"""

import asyncio
import os
import queue
import socket
from typing import Any, Optional

from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse
from ray import serve

import numpy as np

from kiln._kiln import KilnTypeError, KilnValueError
from kiln._v2 import (RequestError, decode_request, encode_response, find_models,
                      malformed_errors, malformed_message, tensor_metadata)
from kiln.engine import load

app = FastAPI()
_HEADER = "inference-header-content-length"


def batch_limit(engine, cap: int) -> int:
    """The largest batch one inference may take: the profile's maximum of the first dimension,
    at most `cap`, where every input's and output's first dimension is dynamic; else 1."""
    if any(not t.shape or isinstance(t.shape[0], int) for t in [*engine.inputs, *engine.outputs]):
        return 1
    limit = cap
    for t in engine.inputs:
        prof = engine.profile.get(t.name)
        if prof:
            limit = min(limit, int(prof["max"][0]))
    return max(limit, 1)


def join(requests: list[dict]) -> dict:
    """Requests' inputs joined along the first dimension (one request: as it is)."""
    if len(requests) == 1:
        return requests[0]
    return {n: np.concatenate([r[n] for r in requests], axis=0) for n in requests[0]}


def split(out: dict, batches: list[int]) -> list[dict]:
    """The outputs of a joined inference, split back per request (views of them)."""
    if len(batches) == 1:
        return [out]
    parts, start = [], 0
    for b in batches:
        parts.append({n: v[start:start + b] for n, v in out.items()})
        start += b
    return parts


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse(status_code=status, content={"error": message})


@serve.deployment
@serve.ingress(app)
class KilnDeployment:
    """Every engine of a model repository behind the v2 REST routes (server and model ready,
    model metadata, infer). Each replica loads every engine and keeps `contexts` execution
    contexts per engine; concurrent requests are batched by @serve.batch."""

    def __init__(self, model_repository: str, contexts: int = 2, max_batch_size: int = 32,
                 batch_wait_timeout_s: float = 0.002):
        self.models = {name: load(path) for name, path in find_models(model_repository).items()}
        self.limits = {name: batch_limit(e, max_batch_size) for name, e in self.models.items()}
        self._infer_batch.set_max_batch_size(max_batch_size)
        self._infer_batch.set_batch_wait_timeout_s(batch_wait_timeout_s)
        self.pools: dict[str, queue.SimpleQueue] = {}
        for name, engine in self.models.items():
            self.pools[name] = queue.SimpleQueue()
            for _ in range(max(contexts, 1)):
                self.pools[name].put(engine.create_context())
        self.replica = f"{socket.gethostname()}:{os.getpid()}"

    def _run(self, name: str, feeds: dict) -> dict:
        pool = self.pools[name]
        ctx = pool.get()
        try:
            return ctx.run(feeds)
        finally:
            pool.put(ctx)

    @serve.batch(max_batch_size=32, batch_wait_timeout_s=0.002, max_concurrent_batches=2)
    async def _infer_batch(self, items: list[tuple[str, dict]]) -> list[Any]:
        """Joins the requests of a batch that fit together (same model, same shapes past the
        first dimension, up to the model's batch limit) and runs each part off the event loop."""
        groups: dict[tuple, list[int]] = {}
        for i, (name, feeds) in enumerate(items):
            key = (name, tuple((n, a.shape[1:], a.dtype.str) for n, a in sorted(feeds.items())))
            groups.setdefault(key, []).append(i)
        results: list[Any] = [None] * len(items)

        async def run_part(name: str, part: list[int], batches: list[int]) -> None:
            try:
                out = await asyncio.to_thread(self._run, name, join([items[i][1] for i in part]))
                outs = split(out, batches)
            except Exception as e:  # noqa: BLE001 - the requests of this part get the error
                outs = [e] * len(part)
            for i, o in zip(part, outs):
                results[i] = o

        tasks = []
        for (name, _), idx in groups.items():
            limit = self.limits[name]
            part: list[int] = []
            batches: list[int] = []
            for i in idx:
                b = next(iter(items[i][1].values())).shape[0] if limit > 1 else 1
                if part and sum(batches) + b > limit:
                    tasks.append(run_part(name, part, batches))
                    part, batches = [], []
                part.append(i)
                batches.append(b)
            tasks.append(run_part(name, part, batches))
        await asyncio.gather(*tasks)
        return results

    @app.get("/v2/health/live")
    @app.get("/v2/health/ready")
    def health(self) -> dict:
        return {"live": True, "ready": True}

    @app.get("/v2/models/{name}/ready")
    def model_ready(self, name: str):
        if name not in self.models:
            return _error(404, f"model '{name}' not found")
        return {"name": name, "ready": True}

    @app.get("/v2/models/{name}")
    def model_metadata(self, name: str):
        if name not in self.models:
            return _error(404, f"model '{name}' not found")
        e = self.models[name]
        return {"name": name, "platform": "kiln", "inputs": tensor_metadata(e.inputs),
                "outputs": tensor_metadata(e.outputs)}

    @app.post("/v2/models/{name}/infer")
    async def infer(self, name: str, request: Request):
        from kserve.errors import InvalidInput
        from kserve.protocol.infer_type import InferRequest

        if name not in self.models:
            return _error(404, f"model '{name}' not found")
        body = await request.body()
        header = request.headers.get(_HEADER)
        try:
            req = InferRequest.from_bytes(body, int(header) if header else len(body), name)
            feeds = decode_request(req, self.models[name], self.limits[name] > 1)
        except (RequestError, InvalidInput) as e:
            return _error(400, str(e))
        except malformed_errors() as e:  # KServe's decoding of a body it cannot read
            return _error(400, malformed_message(e))
        out = await self._infer_batch((name, feeds))
        if isinstance(out, (KilnValueError, KilnTypeError)):  # what the engine itself refuses
            return _error(400, str(out))
        if isinstance(out, Exception):
            return _error(500, str(out))
        try:
            resp = encode_response(req, out, name)
        except RequestError as e:
            return _error(400, str(e))
        resp.parameters = {"kiln_replica": self.replica}
        payload, json_length = resp.to_rest()
        if json_length is None:
            return JSONResponse(payload, headers={"kiln-replica": self.replica})
        return Response(payload, media_type="application/octet-stream",
                        headers={_HEADER: str(json_length), "kiln-replica": self.replica})


def deployment(model_repository: str, *, num_gpus: float = 1, num_replicas: Optional[int] = None,
               min_replicas: int = 1, max_replicas: int = 4, max_batch_size: int = 32,
               batch_wait_timeout_s: float = 0.002, contexts: int = 2,
               num_cpus: Optional[float] = None) -> serve.Application:
    """The kiln deployment bound to `model_repository`: one replica per GPU (num_gpus=1), a
    fixed `num_replicas` or autoscaling between min_replicas and max_replicas on the requests
    each replica has in flight."""
    options: dict[str, Any] = {"ray_actor_options": {"num_gpus": float(num_gpus)}}
    if num_cpus is not None:
        options["ray_actor_options"]["num_cpus"] = float(num_cpus)
    if num_replicas:
        options["num_replicas"] = int(num_replicas)
    else:
        options["autoscaling_config"] = {"min_replicas": int(min_replicas),
                                         "max_replicas": int(max_replicas),
                                         "target_ongoing_requests": 2 * int(max_batch_size)}
    return KilnDeployment.options(**options).bind(os.path.abspath(model_repository), int(contexts),
                                                  int(max_batch_size), float(batch_wait_timeout_s))


def app_builder(args: dict[str, str]) -> serve.Application:
    """For `serve run kiln.ray_serve:app_builder model_repository=DIR [num_gpus=1] ...`."""
    a = dict(args)
    repo = a.pop("model_repository", None)
    if not repo:
        raise ValueError("model_repository=DIR is required")
    kinds = {"num_gpus": float, "num_replicas": int, "min_replicas": int, "max_replicas": int,
             "max_batch_size": int, "batch_wait_timeout_s": float, "contexts": int,
             "num_cpus": float}
    unknown = set(a) - set(kinds)
    if unknown:
        raise ValueError(f"unknown arguments: {', '.join(sorted(unknown))}")
    return deployment(repo, **{k: kinds[k](v) for k, v in a.items()})
