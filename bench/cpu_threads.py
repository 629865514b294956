"""What the thread that runs CPU inferences costs: one engine served from the thread that loaded it, from two
worker threads in turn (each with its own OpenMP team, as dynamic batchers' workers ran them until 2026-12-06),
and through two dynamic batchers (whose CPU batches now all run on `runtime.cpu_thread`). Each form runs in a fresh
process (OpenMP teams live as long as their threads), on an engine built in another one; requests go one at a
time, so any difference is the threads', not contention for the cores.

    python bench/cpu_threads.py --model mobilenetv3 --out DIR     (writes cpu-threads.json, prints a table)
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import onnx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
FORMS = ("main thread", "two worker threads", "two batchers")


def _time(call, requests: int) -> float:
    """Median of five rounds of `requests` calls, in ms a call, after 20 untimed ones."""
    for _ in range(20):
        call(0)
    rounds = []
    for _ in range(5):
        started = time.perf_counter()
        for index in range(requests):
            call(index)
        rounds.append((time.perf_counter() - started) / requests * 1e3)
    return statistics.median(rounds)


def run_form(engine_path: str, form: str, requests: int) -> float:
    """One form's ms a request, in this process."""
    from tensorforge.runtime.batcher import DynamicBatcher
    from tensorforge.runtime.engine import Engine

    engine = Engine.load(engine_path)
    name = engine.model.graph.inputs[0].name
    shape = engine.plans[0].profile.ranges[name].opt
    feeds = {name: np.random.default_rng(0).standard_normal(shape).astype(np.float32)}
    if form == "main thread":
        context = engine.create_context()
        return _time(lambda _: context.run(feeds), requests)
    if form == "two worker threads":
        contexts = [engine.create_context() for _ in range(2)]
        pools = [ThreadPoolExecutor(1) for _ in range(2)]
        return _time(lambda i: pools[i % 2].submit(contexts[i % 2].run, feeds).result(), requests)
    batchers = [DynamicBatcher(engine, max_delay_ms=0) for _ in range(2)]
    try:
        return _time(lambda i: batchers[i % 2].infer(feeds), requests)
    finally:
        for batcher in batchers:
            batcher.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="mobilenetv3")
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--requests", type=int, default=100)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--form", choices=FORMS, help=argparse.SUPPRESS)  # one form, in a child process
    parser.add_argument("--engine", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.form:
        print(json.dumps(run_form(args.engine, args.form, args.requests)))
        return
    from tensorforge import zoo

    with tempfile.TemporaryDirectory() as folder:
        model, engine = Path(folder) / "model.onnx", Path(folder) / "model.engine"
        onnx.save(zoo.export(args.model, batch=1, size=args.size, dynamic_batch=False), model)
        build = [sys.executable, "-m", "tensorforge", "build", str(model), "-o", str(engine), "--effort", "0"]
        subprocess.run(build, check=True, capture_output=True)
        rows = []
        for form in FORMS:
            child = [sys.executable, __file__, "--form", form, "--engine", str(engine)]
            child += ["--requests", str(args.requests)]
            ms = json.loads(subprocess.run(child, check=True, capture_output=True, text=True).stdout)
            rows.append({"model": args.model, "size": args.size, "form": form, "ms_per_request": ms})
            print(f"{args.model} {form:>20}: {ms:.3f} ms a request")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "cpu-threads.json").write_text(json.dumps({"rows": rows}, indent=1))


if __name__ == "__main__":
    main()
