"""kiln engines as KServe models: `KilnModel` is a `kserve.Model` whose `predict` runs a kiln
engine on the Open Inference Protocol's (v2) requests, so that KServe's own `ModelServer` serves
it (REST and gRPC, health, metadata, its metrics); kiln has no protocol code of its own here.

`python -m kiln.kserve` also makes a body that KServe's decoding cannot read a 400 with one line
(refuse_malformed) where KServe alone answers 500.

As KServe's custom predictors run (the container's command in an InferenceService)::

    python -m kiln.kserve --model_dir /mnt/models [--model_name resnet50] [--contexts 2]
                          [--device 0] [--http_port 8080] [--grpc_port 8081]

`--model_dir`: an engine file, a folder holding `model.kiln` (either: one model, called
`--model_name`), or a model repository (`NAME.kiln`, `NAME/model.kiln`: every engine a model
called NAME). Every option of KServe's ModelServer (`--http_port`, `--grpc_port`,
`--enable_grpc`, `--max_asyncio_workers`, ...) is taken as KServe takes it.

From Python::

    from kserve import ModelServer
    from kiln.kserve import KilnModel, refuse_malformed
    model = KilnModel("resnet50", "resnet50.kiln", contexts=2)
    model.load()
    refuse_malformed(ModelServer()).start([model])

A request runs on one of the model's `contexts` execution contexts, on a thread of the event
loop's executor, as it comes: KServe's server does not join requests into batches. For
throughput (a dynamic batcher, several GPUs, shared memory) `kiln serve` is the C++ server.
"""
from __future__ import annotations

import argparse
import asyncio
import logging
import os
import queue
import sys
from typing import Optional

import kserve
from kserve.errors import InvalidInput

from kiln._kiln import KilnError, KilnTypeError, KilnValueError
from kiln._v2 import (RequestError, decode_request, encode_response, find_models,
                      malformed_errors, malformed_message, tensor_metadata)
from kiln.engine import Engine, load

log = logging.getLogger("kiln.kserve")


class KilnModel(kserve.Model):
    """One kiln engine as a KServe model (v2 protocol): `load()` loads the engine (onto GPU
    `device`, default the current one) and makes `contexts` execution contexts, requests run
    concurrently up to that many; model metadata lists the engine's inputs and outputs."""

    def __init__(self, name: str, engine_path: str, contexts: int = 2,
                 device: Optional[int] = None):
        super().__init__(name)
        if contexts < 1:
            raise ValueError(f"contexts must be at least 1, not {contexts}")
        self.engine_path = str(engine_path)
        self.contexts = contexts
        self.device = device
        self.engine: Optional[Engine] = None
        self._pool: queue.SimpleQueue = queue.SimpleQueue()

    def load(self) -> bool:
        self.engine = load(self.engine_path, device=self.device)
        for _ in range(self.contexts):
            self._pool.put(self.engine.create_context())
        self.ready = True
        log.info("model %s: %s (%s backend), %d contexts", self.name, self.engine_path,
                 self.engine.backend, self.contexts)
        return self.ready

    def get_input_types(self) -> list[dict]:
        return tensor_metadata(self.engine.inputs)

    def get_output_types(self) -> list[dict]:
        return tensor_metadata(self.engine.outputs)

    def _run(self, feeds: dict) -> dict:
        ctx = self._pool.get()
        try:
            return ctx.run(feeds)
        finally:
            self._pool.put(ctx)

    async def predict(self, payload, headers=None, response_headers=None):
        try:
            feeds = decode_request(payload, self.engine)
        except RequestError as e:
            raise InvalidInput(str(e)) from None
        try:
            out = await asyncio.get_running_loop().run_in_executor(None, self._run, feeds)
        except (KilnValueError, KilnTypeError) as e:  # what the engine itself refuses
            raise InvalidInput(str(e)) from None
        try:
            return encode_response(payload, out, self.name)
        except RequestError as e:
            raise InvalidInput(str(e)) from None


def refuse_malformed(server: kserve.ModelServer) -> kserve.ModelServer:
    """Makes `server` answer a request body its decoding cannot read with a 400 and one line
    ("malformed request: ...", KServe's InvalidInput) instead of KServe's 500: the request, not
    the server, is at fault. Wraps KServe's own decoding; decodes nothing itself."""
    decode = server.dataplane.decode_inference_request
    malformed = malformed_errors()

    def checked(body, headers, model_name):
        try:
            return decode(body, headers, model_name)
        except InvalidInput:
            raise
        except malformed as e:
            raise InvalidInput(malformed_message(e)) from None

    server.dataplane.decode_inference_request = checked
    return server


def models_in(model_dir: str, model_name: str, contexts: int = 2,
              device: Optional[int] = None) -> list[KilnModel]:
    """The models of `model_dir`: an engine file or a folder holding model.kiln is one model
    called `model_name`; any other folder is a model repository, each engine a model called by
    its name. Not loaded."""
    if os.path.isfile(model_dir):
        return [KilnModel(model_name, model_dir, contexts, device)]
    if os.path.isfile(os.path.join(model_dir, "model.kiln")):
        return [KilnModel(model_name, os.path.join(model_dir, "model.kiln"), contexts, device)]
    if not os.path.exists(model_dir):
        raise FileNotFoundError(f"--model_dir '{model_dir}' does not exist")
    found = find_models(model_dir)
    if not found:
        raise FileNotFoundError(f"--model_dir '{model_dir}' holds no engine (NAME.kiln, "
                                "NAME/model.kiln or model.kiln)")
    return [KilnModel(name, path, contexts, device) for name, path in found.items()]


def parse_args(argv: Optional[list] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m kiln.kserve", parents=[kserve.model_server.parser],
        description="Serve kiln engines with KServe's ModelServer (Open Inference Protocol, "
                    "REST and gRPC).")
    parser.add_argument("--model_dir", required=True,
                        help="An engine file, a folder holding model.kiln, or a model "
                             "repository (NAME.kiln, NAME/model.kiln)")
    parser.add_argument("--contexts", type=int, default=2,
                        help="Execution contexts per model: requests run concurrently")
    parser.add_argument("--device", type=int, default=None,
                        help="GPU to load the engines onto (default: the current one)")
    args = parser.parse_args(argv)
    if args.contexts < 1:
        parser.error(f"--contexts must be at least 1, not {args.contexts}")
    return args


def main(argv: Optional[list] = None) -> int:
    args = parse_args(argv)
    try:
        models = models_in(args.model_dir, args.model_name, args.contexts, args.device)
        for m in models:
            m.load()
    except (OSError, KilnError) as e:
        print(f"kiln.kserve: error: {e}", file=sys.stderr)
        return 1
    server = kserve.ModelServer(http_port=args.http_port, grpc_port=args.grpc_port,
                                workers=args.workers, max_threads=args.max_threads,
                                max_asyncio_workers=args.max_asyncio_workers,
                                enable_grpc=args.enable_grpc)
    refuse_malformed(server).start(models)
    return 0


if __name__ == "__main__":
    sys.exit(main())
