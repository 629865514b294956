"""`tensorforge serve`: engines behind an HTTP server speaking KServe v2 / the Open Inference Protocol."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ..errors import InputError, TensorforgeError
from ..runtime.engine import Engine
from .common import app, fail, out


@app.command()
def serve(
    engines: Annotated[
        list[str], typer.Argument(help="engine files, as PATH or NAME=PATH (the name defaults to the file's stem)")
    ],
    host: Annotated[str, typer.Option(help="address to listen on")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="port to listen on")] = 8000,
    max_delay_ms: Annotated[float, typer.Option(help="longest a request waits for others to batch with")] = 2.0,
    contexts: Annotated[int, typer.Option(min=1, help="execution contexts (CUDA streams) per model")] = 1,
    max_queue: Annotated[int, typer.Option(min=1, help="requests that may wait; more get 503")] = 256,
    max_batch: Annotated[
        int | None, typer.Option(min=1, help="largest merged batch (default: the engine's; 1: no batching)")
    ] = None,
    timeout_s: Annotated[float, typer.Option(help="a request still queued after this gets 504")] = 30.0,
    max_body_mib: Annotated[float, typer.Option(help="largest request body accepted (413 above)")] = 64.0,
    device: Annotated[str | None, typer.Option(help="run on this device (default: the engines' own)")] = None,
) -> None:
    """Serve engines over KServe v2 HTTP: health, model metadata and readiness, infer, and /metrics."""
    import uvicorn

    from ..serve.app import ServeOptions, create_app

    try:
        loaded = {}
        for item in engines:
            name, sep, path = item.rpartition("=")
            path = Path(path if sep else item)
            name = name if sep else path.stem
            if name in loaded:
                raise InputError(f"two engines are named {name!r}; give one as NAME=PATH")
            loaded[name] = Engine.load(path, device=device)
        options = ServeOptions(
            max_delay_ms=max_delay_ms,
            contexts=contexts,
            max_queue=max_queue,
            max_batch=max_batch,
            timeout_s=timeout_s,
            max_body_bytes=int(max_body_mib * 2**20),
        )
        application = create_app(loaded, options)
    except TensorforgeError as error:
        fail(error)
    out.print(f"serving {', '.join(sorted(loaded))} on http://{host}:{port}/v2")
    uvicorn.run(application, host=host, port=port, log_level="warning", timeout_graceful_shutdown=30)
