"""Shared test helpers: build small ONNX models, run them on tensorforge and ONNX Runtime, compare."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping, Sequence

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

from tensorforge import Executor
from tensorforge.frontend import import_model
from tensorforge.kernels.cpu.avx512 import vnni
from tensorforge.tensors import to_numpy

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]

# Largest relative error accepted against ONNX Runtime, per output dtype (normwise: max|a−b| / max|b|).
TOLERANCE = {np.float32: 1e-5, np.float64: 1e-12, np.float16: 2e-3}


def make_model(
    nodes: Sequence[onnx.NodeProto],
    inputs: Sequence[onnx.ValueInfoProto],
    outputs: Sequence[onnx.ValueInfoProto],
    opset: int = 17,
    initializers: Sequence[onnx.TensorProto] = (),
    ir_version: int | None = None,
) -> onnx.ModelProto:
    graph = helper.make_graph(list(nodes), "test", list(inputs), list(outputs), list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = ir_version or min(onnx.IR_VERSION, 10)
    return model


def tensor_info(name: str, shape, dtype=TensorProto.FLOAT) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, dtype, shape)


def fused_conv(
    x_shape: Sequence[int],
    weight: np.ndarray,
    bias: np.ndarray | None,
    residual_shape: Sequence[int] | None = None,
    activation: str = "",
    **conv,
):
    """The one fused node the optimizer makes of Conv(x, w, b) (+ Add of a residual input r) (+ `activation`, with
    Clip between 0 and 6), on an input x of `x_shape`."""
    from onnx import numpy_helper

    from tensorforge.passes.pipeline import optimize

    names = ["x", "w", "b"] if bias is not None else ["x", "w"]
    nodes, inputs, last = [helper.make_node("Conv", names, ["c"], **conv)], [tensor_info("x", list(x_shape))], "c"
    inits = [numpy_helper.from_array(weight, "w")] + ([numpy_helper.from_array(bias, "b")] if bias is not None else [])
    if residual_shape is not None:
        inputs.append(tensor_info("r", list(residual_shape)))
        nodes.append(helper.make_node("Add", ["c", "r"], ["s"]))
        last = "s"
    if activation:
        operands = [last]
        if activation == "Clip":
            operands += ["lo", "hi"]
            inits += [numpy_helper.from_array(np.array(v, np.float32), n) for n, v in (("lo", 0.0), ("hi", 6.0))]
        nodes.append(helper.make_node(activation, operands, ["y"]))
        last = "y"
    model, _ = optimize(import_model(make_model(nodes, inputs, [tensor_info(last, None)], 17, inits)))
    (node,) = model.graph.nodes
    return node


def fused_gemm(x_shape, activation="", trans_b=False, residual=False, matmul=True, n=24):
    """MatMul (or Gemm) + bias (+ residual) (+ activation) with `n` outputs, optimized into one FusedGemm, and its
    feeds (random)."""
    from onnx import numpy_helper

    from tensorforge.passes.pipeline import optimize

    rng = np.random.default_rng(0)
    k = x_shape[-1]
    w = rng.standard_normal((n, k) if trans_b else (k, n)).astype(np.float32) / k**0.5
    b = rng.standard_normal(n).astype(np.float32)
    if matmul:
        nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Add", ["m", "b"], ["c"])]
    else:
        nodes = [helper.make_node("Gemm", ["x", "w", "b"], ["c"], transB=int(trans_b))]
    inputs, last = [tensor_info("x", x_shape)], "c"
    if residual:
        inputs.append(tensor_info("r", [*x_shape[:-1], n]))
        nodes.append(helper.make_node("Add", [last, "r"], ["s"]))
        last = "s"
    if activation:
        nodes.append(helper.make_node(activation, [last], ["y"]))
        last = "y"
    inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")]
    model, _ = optimize(import_model(make_model(nodes, inputs, [tensor_info(last, None)], 17, inits)))
    (node,) = model.graph.nodes
    assert node.op_type == "FusedGemm"
    feeds = [torch.randn(x_shape)] + ([torch.randn(*x_shape[:-1], n)] if residual else [])
    return node, feeds


def layer_norm_node(shape, axis, bias=True, outputs=("y",), stash_type=1):
    """An imported LayerNormalization node over `shape`'s axes from `axis` on, with a constant scale (and bias)."""
    rng = np.random.default_rng(0)
    normalized = shape[axis % len(shape) :]
    inits = [numpy_helper.from_array(rng.normal(1, 0.2, normalized).astype(np.float32), "scale")]
    inputs = ["x", "scale"]
    if bias:
        inits.append(numpy_helper.from_array(rng.normal(0, 0.2, normalized).astype(np.float32), "bias"))
        inputs.append("bias")
    node = helper.make_node("LayerNormalization", inputs, list(outputs), axis=axis, epsilon=1e-5, stash_type=stash_type)
    infos = [tensor_info(name, None) for name in outputs]
    (node,) = import_model(make_model([node], [tensor_info("x", shape)], infos, 17, inits)).graph.nodes
    return node


def run_tensorforge(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray], device: str = "cpu"):
    imported = import_model(model)
    results = Executor(imported, device).run(feeds)
    dtypes = {v.name: v.dtype for v in imported.graph.outputs}
    return {name: to_numpy(value, dtypes[name]) for name, value in results.items()}


def needs_onednn_int8():
    """A mark skipping a test of oneDNN's int8 kernels where they saturate (`tactics.vendor.onednn_int8_problem`)."""
    from tensorforge.tactics.vendor import onednn_int8_problem

    return pytest.mark.skipif(onednn_int8_problem() is not None, reason=onednn_int8_problem() or "")


def run_onnxruntime(model: onnx.ModelProto | str, feeds: Mapping[str, np.ndarray], *, quantized: bool = False):
    """ONNX Runtime's outputs by name. `quantized`: the model carries Q/DQ pairs, whose integer products ONNX
    Runtime computes exactly only on a CPU with VNNI; without it (AVX2 alone) its u8s8 product adds each pair of
    products in int16 and saturates, so there the graph runs unfused (dequantized operands, float32 products of
    small integers times two scales, quantized)."""
    import onnxruntime as ort

    source = model if isinstance(model, str) else model.SerializeToString()
    options = ort.SessionOptions()
    if quantized and not vnni():
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(None, dict(feeds)), strict=True))


def relative_error(actual: np.ndarray, expected: np.ndarray) -> float:
    """max|actual − expected| / max|expected| (0 when both are all zero)."""
    actual = np.asarray(actual, dtype=np.float64)
    expected = np.asarray(expected, dtype=np.float64)
    scale = np.abs(expected).max() if expected.size else 0.0
    diff = np.abs(actual - expected).max() if expected.size else 0.0
    return float(diff / scale) if scale else float(diff)


def assert_matches_onnxruntime(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray], device: str = "cpu"):
    ours = run_tensorforge(model, feeds, device)
    theirs = run_onnxruntime(model, feeds)
    assert set(ours) == set(theirs)
    for name, expected in theirs.items():
        actual = ours[name]
        assert actual.shape == expected.shape, f"{name}: shape {actual.shape} != {expected.shape}"
        assert actual.dtype == expected.dtype, f"{name}: dtype {actual.dtype} != {expected.dtype}"
        if expected.dtype.kind in "f":
            tol = TOLERANCE[expected.dtype.type]
            err = relative_error(actual, expected)
            assert err <= tol, f"{name}: relative error {err:.3g} > {tol:g}"
        else:
            np.testing.assert_array_equal(actual, expected, err_msg=name)
    return ours


# Prepended to a `compile_for_hopper` script: `ptxas_verdict(ptx)` assembles PTX for sm_90a with the ptxas Triton
# itself runs (newer Triton have one for Hopper and later apart) and returns (1 if ptxas serialized the wgmma
# pipeline else 0, bytes of register spill stores).
PTXAS_VERDICT = r"""
import re as _re, subprocess as _subprocess, tempfile as _tempfile
from triton.backends.nvidia import compiler as _nvidia
try:
    _PTXAS = _nvidia.get_ptxas(90).path
except AttributeError:
    from triton import knobs as _knobs
    _PTXAS = _knobs.nvidia.ptxas.path


def ptxas_verdict(ptx):
    with _tempfile.TemporaryDirectory() as folder:
        with open(folder + "/k.ptx", "w") as f:
            f.write(ptx)
        command = [_PTXAS, "-arch=sm_90a", "-v", folder + "/k.ptx", "-o", folder + "/k.cubin"]
        log = _subprocess.run(command, capture_output=True, text=True).stderr
    return int("serialized" in log), sum(int(n) for n in _re.findall(r"(\d+) bytes spill stores", log))
"""


def compile_for_hopper(script: str) -> list[list[str]]:
    """Run `script` in a fresh Python without the Triton interpreter (Triton's real compiler, for sm_90: no GPU
    needed) and return its output lines split into words; skips the test where the compiler is missing or its
    ptxas does not work."""
    pytest.importorskip("triton.backends.nvidia.compiler")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True)
    raised = done.stderr.strip().splitlines()[-1] if done.stderr.strip() else ""
    if done.returncode and "ptxas" in raised.lower():  # the error raised, not the kernel source a traceback quotes
        pytest.skip(f"no working ptxas here: {raised[-300:]}")
    assert done.returncode == 0, done.stderr[-2000:]
    return [line.split() for line in done.stdout.splitlines()]


def record_returns(monkeypatch: pytest.MonkeyPatch, owner: object, name: str) -> list:
    """What each call of `owner.name` returns from now on, in order (the function still runs)."""
    seen: list = []
    real = getattr(owner, name)

    def recording(*args, **kwargs):
        seen.append(real(*args, **kwargs))
        return seen[-1]

    monkeypatch.setattr(owner, name, recording)
    return seen


class RecordedLaunches:
    """Stands in for a Triton kernel's `kernel[grid](*args, **options)` launch and records (grid, args, options):
    the host side of a GPU kernel checked on the CPU."""

    def __init__(self) -> None:
        self.calls: list[tuple[tuple, tuple, dict]] = []

    def __getitem__(self, grid):
        return lambda *args, **options: self.calls.append((grid, args, options))
