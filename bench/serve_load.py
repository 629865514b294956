"""Load test of `tensorforge serve` over loopback: many concurrent clients, dynamic batching on and off.

Builds an engine for a zoo model with a batch profile, starts the KServe v2 server on 127.0.0.1 (in this
process, on a free port), and sends `--requests` infer requests (binary tensor extension) from `--clients`
concurrent clients, once with dynamic batching and once with each request run alone. Every answer is
checked against a direct run of the engine; none may be lost. Reports throughput and p50/p99 latency as
JSON and a markdown table.

    python bench/serve_load.py --model inception --clients 32 --requests 512 --out bench/results
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import torch
import uvicorn

from tensorforge import __version__, zoo
from tensorforge.build.builder import build_engine
from tensorforge.build.config import BuildConfig, Profile
from tensorforge.frontend import import_model
from tensorforge.serve.app import ServeOptions, create_app
from tensorforge.serve.protocol import HEADER_LENGTH


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(engine, options: ServeOptions, inputs: list[np.ndarray], clients: int) -> dict:
    port = _free_port()
    app = create_app({"model": engine}, options)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.02)
    url = f"http://127.0.0.1:{port}/v2/models/model/infer"
    local = threading.local()

    def call(x: np.ndarray) -> tuple[float, int, np.ndarray | None]:
        client = getattr(local, "client", None) or httpx.Client(timeout=120)
        local.client = client
        tensor = {
            "name": "input",
            "datatype": "FP32",
            "shape": list(x.shape),
            "parameters": {"binary_data_size": x.nbytes},
        }
        header = json.dumps({"inputs": [tensor], "parameters": {"binary_data_output": True}}).encode()
        start = time.perf_counter()
        response = client.post(url, content=header + x.tobytes(), headers={HEADER_LENGTH: str(len(header))})
        elapsed = time.perf_counter() - start
        if response.status_code != 200:
            return elapsed, response.status_code, None
        split = int(response.headers[HEADER_LENGTH])
        out = json.loads(response.content[:split])["outputs"][0]
        return elapsed, 200, np.frombuffer(response.content[split:], dtype=np.float32).reshape(out["shape"])

    started = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        results = list(pool.map(call, inputs))
    wall = time.perf_counter() - started
    server.should_exit = True
    thread.join(60)
    stats = app.state.models["model"].batcher.stats
    latencies = sorted(r[0] for r in results)
    return {
        "results": results,
        "throughput_rps": len(inputs) / wall,
        "p50_ms": 1e3 * statistics.median(latencies),
        "p99_ms": 1e3 * latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))],
        "batches": stats.batches,
        "mean_batch": sum(size * count for size, count in stats.batch_sizes.items()) / max(stats.batches, 1),
        "errors": sum(1 for r in results if r[1] != 200),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="inception", choices=sorted(zoo.MODELS))
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--max-batch", type=int, default=16)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--requests", type=int, default=512)
    parser.add_argument("--contexts", type=int, default=2)
    parser.add_argument("--max-delay-ms", type=float, default=2.0)
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    args = parser.parse_args()
    sample = zoo.input_shape(args.model, 1)
    profile = Profile().add("input", sample, (args.max_batch // 2, *sample[1:]), (args.max_batch, *sample[1:]))
    engine = build_engine(
        import_model(zoo.export(args.model)), BuildConfig(device=args.device, effort=0, profiles=(profile,))
    )
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal(sample).astype(np.float32) for _ in range(args.requests)]
    context = engine.create_context()
    expected = [context.run({"input": x})["output"].cpu().numpy() for x in inputs]
    rows = []
    for mode, max_batch in (("dynamic batching", None), ("one request per call", 1)):
        options = ServeOptions(max_delay_ms=args.max_delay_ms, contexts=args.contexts, max_batch=max_batch)
        result = _run(engine, options, inputs, args.clients)
        wrong = sum(
            1
            for (_, status, got), want in zip(result.pop("results"), expected, strict=True)
            if status == 200 and np.abs(got - want).max() > 1e-4 * np.abs(want).max()
        )
        rows.append({"mode": mode, "wrong": wrong, **result})
    name = torch.cuda.get_device_name() if args.device.startswith("cuda") else "CPU"
    meta = {"device": name, "model": args.model, "clients": args.clients, "requests": args.requests,
            "contexts": args.contexts, "max_delay_ms": args.max_delay_ms, "tensorforge": __version__,
            "torch": torch.__version__, "date": time.strftime("%Y-%m-%d")}  # fmt: skip
    lines = [
        "| mode | requests/s | p50 ms | p99 ms | batches | mean batch | errors | wrong |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['mode']} | {r['throughput_rps']:.0f} | {r['p50_ms']:.1f} | {r['p99_ms']:.1f} | {r['batches']} | "
            f"{r['mean_batch']:.1f} | {r['errors']} | {r['wrong']} |"
        )
    table = "\n".join(lines)
    args.out.mkdir(parents=True, exist_ok=True)
    stem = f"serve_load_{args.model}_{'cuda' if args.device.startswith('cuda') else 'cpu'}"
    (args.out / f"{stem}.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))
    (args.out / f"{stem}.md").write_text(f"{meta}\n\n{table}\n")
    print(meta)
    print(table)


if __name__ == "__main__":
    main()
