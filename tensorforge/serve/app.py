"""The inference server: KServe v2 / Open Inference Protocol over HTTP (a Starlette ASGI app), one dynamic
batcher per model, Prometheus metrics at `/metrics`.

Every failure is an answer, never a crash: 400 for a malformed body or a wrong input name, shape or dtype,
404 for an unknown model, 413 for a body over the size limit, 503 while the queue is full or the server
shuts down, 504 for a request that timed out in the queue, 500 (with the message) for an error while running.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from .. import __version__
from ..errors import InputError, TensorforgeError
from ..ir import DType
from ..runtime.batcher import Busy, DynamicBatcher, ShuttingDown
from ..runtime.engine import Engine
from .protocol import HEADER_LENGTH, ProtocolError, datatype_of, decode_request, encode_response


@dataclass(frozen=True)
class ServeOptions:
    max_delay_ms: float = 2.0
    contexts: int = 1
    max_queue: int = 256
    timeout_s: float | None = 30.0
    max_body_bytes: int = 64 << 20
    preferred_batch_sizes: tuple[int, ...] = ()
    max_batch: int | None = None  # None: the engine's largest; 1: no dynamic batching


class _Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "tensorforge_requests", "Inference requests by model and HTTP status", ["model", "status"],
            registry=self.registry,
        )  # fmt: skip
        self.latency = Histogram(
            "tensorforge_request_latency_seconds", "Inference request latency", ["model"], registry=self.registry,
            buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5),
        )  # fmt: skip
        self.batch = Histogram(
            "tensorforge_batch_size", "Size of the batches run", ["model"], registry=self.registry,
            buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256),
        )  # fmt: skip
        self.queue = Gauge("tensorforge_queue_depth", "Requests waiting", ["model"], registry=self.registry)


class ServedModel:
    """One engine behind the server: its metadata and its batcher."""

    def __init__(self, name: str, engine: Engine, options: ServeOptions, metrics: _Metrics) -> None:
        self.name = name
        self.engine = engine
        graph = engine.model.graph
        self.inputs = [v for v in graph.inputs if v.name not in graph.initializers]
        self.outputs = [v.name for v in graph.outputs]
        self.batcher = DynamicBatcher(
            engine,
            max_delay_ms=options.max_delay_ms,
            preferred_batch_sizes=options.preferred_batch_sizes,
            max_queue=options.max_queue,
            contexts=options.contexts,
            timeout_s=options.timeout_s,
            on_batch=metrics.batch.labels(name).observe,
            max_batch=options.max_batch,
        )
        metrics.queue.labels(name).set_function(lambda: self.batcher.queue_depth)

    def metadata(self) -> dict[str, Any]:
        def tensor(value) -> dict[str, Any]:
            shape = [d if isinstance(d, int) else -1 for d in (value.shape or ())]
            if shape:
                shape[0] = -1  # the batch axis: requests of 1..max batch
            dtype = value.dtype.numpy if value.dtype.has_torch else None
            return {
                "name": value.name,
                "datatype": datatype_of(dtype) if dtype is not None else "BYTES",
                "shape": shape,
            }

        graph = self.engine.model.graph
        return {
            "name": self.name,
            "versions": ["1"],
            "platform": "tensorforge",
            "inputs": [tensor(v) for v in self.inputs],
            "outputs": [tensor(v) for v in graph.outputs],
            "parameters": {"max_batch_size": self.batcher.max_batch, "device": str(self.engine.device)},
        }

    def check(self, inputs: Mapping[str, np.ndarray]) -> None:
        """Names and dtypes against the model, before queueing (shapes are the profiles' to judge)."""
        by_name = {v.name: v for v in self.inputs}
        for name, array in inputs.items():
            value = by_name.get(name)
            if value is None:
                raise ProtocolError(f"model {self.name!r} has no input {name!r}; its inputs are {sorted(by_name)}")
            want = value.dtype
            if want != DType.UNDEFINED and want.has_torch and np.dtype(want.numpy) != array.dtype:
                raise ProtocolError(
                    f"input {name!r} is {datatype_of(array.dtype)}, model {self.name!r} expects "
                    f"{datatype_of(np.dtype(want.numpy))}"
                )
        missing = sorted(set(by_name) - set(inputs))
        if missing:
            raise ProtocolError(f"model {self.name!r} needs inputs {missing}")


def create_app(engines: Mapping[str, Engine], options: ServeOptions | None = None) -> Starlette:
    """The ASGI app serving `engines` by model name."""
    options = options or ServeOptions()
    metrics = _Metrics()
    models = {name: ServedModel(name, engine, options, metrics) for name, engine in engines.items()}
    state = {"stopping": False}

    def model_of(request: Request) -> ServedModel:
        name = request.path_params["name"]
        if name not in models:
            raise ProtocolError(f"no model {name!r}; this server has {sorted(models)}", 404)
        return models[name]

    async def live(request: Request) -> Response:
        return JSONResponse({"live": True})

    async def ready(request: Request) -> Response:
        return JSONResponse({"ready": not state["stopping"]}, status_code=503 if state["stopping"] else 200)

    async def server_metadata(request: Request) -> Response:
        return JSONResponse({"name": "tensorforge", "version": __version__, "extensions": ["binary_tensor_data"]})

    async def model_metadata(request: Request) -> Response:
        return _guard(lambda: JSONResponse(model_of(request).metadata()))

    async def model_ready(request: Request) -> Response:
        def answer():
            model_of(request)
            return JSONResponse({"ready": not state["stopping"]}, status_code=503 if state["stopping"] else 200)

        return _guard(answer)

    async def infer(request: Request) -> Response:
        started = time.perf_counter()
        name = request.path_params["name"]
        response = await _infer(request, models, state, options)
        if name in models:
            metrics.requests.labels(name, str(response.status_code)).inc()
            if response.status_code == 200:
                metrics.latency.labels(name).observe(time.perf_counter() - started)
        return response

    async def metrics_endpoint(request: Request) -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        state["stopping"] = True  # the server has stopped taking connections; finish what is queued
        await asyncio.gather(*(asyncio.to_thread(model.batcher.close) for model in models.values()))

    routes = [
        Route("/v2", server_metadata),
        Route("/v2/health/live", live),
        Route("/v2/health/ready", ready),
        Route("/v2/models/{name}", model_metadata),
        Route("/v2/models/{name}/ready", model_ready),
        Route("/v2/models/{name}/infer", infer, methods=["POST"]),
        Route("/metrics", metrics_endpoint),
    ]
    app = Starlette(routes=routes, lifespan=lifespan)
    app.state.models = models
    return app


async def _infer(request: Request, models, state, options: ServeOptions) -> Response:
    try:
        name = request.path_params["name"]
        if name not in models:
            raise ProtocolError(f"no model {name!r}; this server has {sorted(models)}", 404)
        if state["stopping"]:
            raise ProtocolError("the server is shutting down", 503)
        model = models[name]
        body = await _read_body(request, options.max_body_bytes)
        decoded = decode_request(body, request.headers.get(HEADER_LENGTH))
        model.check(decoded.inputs)
        try:
            outputs = await asyncio.wrap_future(model.batcher.submit(decoded.inputs))
        except Busy as err:
            raise ProtocolError(str(err), 503) from None
        except ShuttingDown as err:
            raise ProtocolError(str(err), 503) from None
        except TimeoutError as err:
            raise ProtocolError(f"timed out in the queue: {err}", 504) from None
        content, headers = encode_response(name, decoded, outputs, model.outputs)
        media = "application/octet-stream" if headers else "application/json"
        return Response(content, headers=headers, media_type=media)
    except ProtocolError as err:
        return JSONResponse({"error": str(err)}, status_code=err.status)
    except InputError as err:
        return JSONResponse({"error": str(err)}, status_code=400)
    except TensorforgeError as err:
        return JSONResponse({"error": str(err)}, status_code=500)
    except Exception as err:  # the server answers, whatever went wrong
        return JSONResponse({"error": f"{type(err).__name__}: {err}"}, status_code=500)


async def _read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise ProtocolError(f"the body is {declared} bytes; this server takes at most {limit}", 413)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise ProtocolError(f"the body is over {limit} bytes, the most this server takes", 413)
        chunks.append(chunk)
    return b"".join(chunks)


def _guard(answer) -> Response:
    try:
        return answer()
    except ProtocolError as err:
        return JSONResponse({"error": str(err)}, status_code=err.status)
