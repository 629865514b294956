"""Run the ONNX backend node tests (built in memory by the installed onnx) against tensorforge.

    python -m tensorforge.conformance [--device cpu|cuda] [-k REGEX] [--write docs/]

Prints pass/fail counts per op and ends with `N passed, M failed, K skipped`; skipped cases are the
documented exclusions in `conformance_exclusions.py`, each with its reason. Outputs are compared exactly as
onnx's own backend runner compares them (shape, dtype, rtol/atol of the case).
"""

from __future__ import annotations

import argparse
import json
import re
import signal
import sys
import time
import warnings
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import onnx
import onnx.defs
import onnx.numpy_helper

from .conformance_exclusions import exclusion_reason

# The ops whose every node-test case must pass or be a documented exclusion.
IN_SCOPE_OPS = frozenset(
    """
    Abs Acos Acosh Add And Asin Asinh Atan Atanh BitShift BitwiseAnd BitwiseNot BitwiseOr BitwiseXor Ceil
    Celu Clip Cos Cosh Div Elu Equal Erf Exp Floor Gelu Greater GreaterOrEqual HardSigmoid HardSwish IsInf
    IsNaN LeakyRelu Less LessOrEqual Log Max Mean Min Mish Mod Mul Neg Not Or PRelu Pow Reciprocal Relu Round
    Selu Shrink Sigmoid Sign Sin Sinh Softplus Softsign Sqrt Sub Sum Swish Tan Tanh ThresholdedRelu Where Xor
    Conv ConvTranspose BatchNormalization InstanceNormalization LayerNormalization GroupNormalization LRN
    MaxPool AveragePool GlobalAveragePool GlobalMaxPool Gemm MatMul Einsum Softmax LogSoftmax Dropout Identity
    Resize Upsample DepthToSpace SpaceToDepth Pad Reshape Flatten Transpose Squeeze Unsqueeze Concat Split
    Slice Gather GatherElements GatherND ScatterND ScatterElements Expand Tile Shape Size Constant
    ConstantOfShape Range ReduceL1 ReduceL2 ReduceLogSum ReduceLogSumExp ReduceMax ReduceMean ReduceMin
    ReduceProd ReduceSum ReduceSumSquare ArgMax ArgMin TopK CumSum NonZero OneHot Trilu Cast CastLike
    NonMaxSuppression LSTM GRU RNN If Loop
    """.split()
)


@dataclass(slots=True)
class CaseResult:
    name: str
    op: str
    status: str  # passed | failed | skipped
    detail: str = ""
    seconds: float = 0.0


def load_cases(pattern: str | None = None):
    from onnx.backend.test.loader import load_model_tests

    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        cases = load_model_tests(kind="node")
    if pattern:
        regex = re.compile(pattern)
        cases = [c for c in cases if regex.search(c.name)]
    return cases


def op_under_test(case) -> str:
    """The op a case is about: its single op type, or for function-expanded cases the op whose name
    the case name starts with."""
    types = {(n.domain or "", n.op_type) for n in case.model.graph.node}
    if len(types) == 1:
        domain, op = next(iter(types))
        return op if domain in ("", "ai.onnx") else f"{domain}:{op}"
    key = case.name.removeprefix("test_").replace("_", "").lower()
    best = max((name for name in _schema_names() if key.startswith(name.lower())), key=len, default=None)
    return best or "(multi-op)"


def _schema_names() -> list[str]:
    global _SCHEMAS
    if _SCHEMAS is None:
        _SCHEMAS = sorted({s.name for s in onnx.defs.get_all_schemas_with_history()})
    return _SCHEMAS


_SCHEMAS: list[str] | None = None


class _Timeout(Exception):
    pass


def _alarm(signum, frame):
    raise _Timeout


def run_case(case, device: str = "CPU", timeout_s: int = 60) -> CaseResult:

    from .backend import TensorforgeBackend

    op = op_under_test(case)
    reason = exclusion_reason(case.name)
    start = time.perf_counter()
    status, detail = "passed", ""
    old = signal.signal(signal.SIGALRM, _alarm) if hasattr(signal, "SIGALRM") else None
    if old is not None:
        signal.alarm(timeout_s)
    try:
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            rep = TensorforgeBackend.prepare(case.model, device)
            for inputs, expected in case.data_sets:
                outputs = rep.run([_normalize(item) for item in inputs])
                expected = [_normalize(item) for item in expected]
                assert_similar(expected, list(outputs), case.rtol, case.atol)
    except _Timeout:
        status, detail = "failed", f"timed out after {timeout_s} s"
    except Exception as err:
        status, detail = "failed", f"{type(err).__name__}: {_first_line(err)}"
    finally:
        if old is not None:
            signal.alarm(0)
            signal.signal(signal.SIGALRM, old)
    if reason is not None:
        detail = reason if status == "failed" else f"excluded ({reason}) but passes: remove the exclusion"
        status = "skipped" if status == "failed" else status
    return CaseResult(case.name, op, status, detail, time.perf_counter() - start)


def assert_similar(expected: list, actual: list, rtol: float, atol: float) -> None:
    """onnx's `Runner.assert_similar_outputs`, applied element by element inside sequences.

    onnx's own version recurses into a sequence with bare arrays where it expects lists, so a sequence of
    scalars cannot be compared there; tensors are compared by its exact rules (shape, dtype, rtol/atol).
    """
    from onnx.backend.test.runner import Runner

    if len(expected) != len(actual):
        raise AssertionError(f"{len(actual)} outputs, expected {len(expected)}")
    for index, (want, got) in enumerate(zip(expected, actual, strict=True)):
        if isinstance(want, list | tuple):
            if not isinstance(got, list | tuple):
                raise AssertionError(f"output {index} is {type(got).__name__}, expected a sequence")
            assert_similar(list(want), list(got), rtol, atol)
        elif want is None or got is None:
            if want is not got:
                raise AssertionError(f"output {index} is {got!r}, expected {want!r}")
        else:
            Runner.assert_similar_outputs([want], [got], rtol=rtol, atol=atol)


def _normalize(item):
    """Case data as onnx's runner passes it: TensorProtos (fp8, sub-byte cases) become numpy arrays."""
    return onnx.numpy_helper.to_array(item) if isinstance(item, onnx.TensorProto) else item


def _first_line(err: Exception) -> str:
    text = str(err).strip().splitlines()
    return (" ".join(line.strip() for line in text[:3]))[:300] if text else ""


def summarize(results: Iterable[CaseResult]) -> dict:
    per_op: dict[str, Counter] = defaultdict(Counter)
    totals: Counter = Counter()
    for r in results:
        per_op[r.op][r.status] += 1
        totals[r.status] += 1
    return {"totals": dict(totals), "per_op": {op: dict(c) for op, c in sorted(per_op.items())}}


def write_report(results: list[CaseResult], out_dir: Path, device: str) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    summary = summarize(results)
    payload = {
        "onnx_version": onnx.__version__,
        "device": device,
        **summary,
        "cases": [asdict(r) | {"seconds": round(r.seconds, 4)} for r in results],
    }
    (out_dir / "conformance.json").write_text(json.dumps(payload, indent=1) + "\n")
    totals = summary["totals"]
    lines = [
        "# ONNX backend node-test conformance",
        "",
        f"onnx {onnx.__version__} node tests, built in memory, run on the {device} reference executor.",
        "Reproduce with `make conformance` (or `python -m tensorforge.conformance --write docs`).",
        "",
        f"**{totals.get('passed', 0)} passed, {totals.get('failed', 0)} failed, "
        f"{totals.get('skipped', 0)} skipped (documented exclusions)** of {len(results)} cases.",
        "",
        "| op | passed | failed | skipped |",
        "|---|---:|---:|---:|",
    ]
    for op, counts in summary["per_op"].items():
        lines.append(f"| {op} | {counts.get('passed', 0)} | {counts.get('failed', 0)} | {counts.get('skipped', 0)} |")
    lines += ["", "## Cases not passing", "", "| case | op | status | reason |", "|---|---|---|---|"]
    for r in results:
        if r.status != "passed":
            lines.append(f"| {r.name} | {r.op} | {r.status} | {r.detail.replace('|', '/')} |")
    (out_dir / "conformance.md").write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-k", "--filter", help="only cases whose name matches this regex")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--write", type=Path, help="write conformance.md and conformance.json here")
    parser.add_argument("-v", "--verbose", action="store_true", help="print every failing case")
    args = parser.parse_args(argv)

    cases = load_cases(args.filter)
    results = [run_case(case, args.device.upper()) for case in cases]
    summary = summarize(results)
    width = max((len(op) for op in summary["per_op"]), default=10)
    for op, counts in summary["per_op"].items():
        print(
            f"{op:<{width}}  {counts.get('passed', 0):4d} passed  {counts.get('failed', 0):4d} failed"
            f"  {counts.get('skipped', 0):4d} skipped"
        )
    if args.verbose:
        for r in results:
            if r.status == "failed" or "remove the exclusion" in r.detail:
                print(f"FAIL {r.name} [{r.op}]: {r.detail}")
    if args.write:
        write_report(results, args.write, args.device)
    totals = summary["totals"]
    passed, failed, skipped = (totals.get(k, 0) for k in ("passed", "failed", "skipped"))
    print(f"{passed} passed, {failed} failed, {skipped} skipped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
