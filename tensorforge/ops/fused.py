"""Fused ops of the `tensorforge` domain, produced by the graph optimizer.

Every fused op is defined in terms of the ONNX ops it replaces, through the registry's own reference
implementations, so a fused graph computes what the original graph computed (the epilogue is evaluated in
at least float32 and rounded once to the output type).

- `FusedConv(X, W, B?, Z?)`: `Y = post(pre(Conv(X, W) + B) + Z)` with every Conv attribute.
- `QuantizedConv(X, Wq, B?, Z?, Ws)`: FusedConv on quantized operands, `Y = post(pre(acc · x_scale · Ws[c] + B)
  + Z)` with `acc = Conv(Q(X), Wq)` (exact in int32 for int8): `Q(X)` quantizes X per tensor by the float
  attribute `x_scale` (int8: `clamp(round(X · (1 / x_scale)), −128, 127)` rounding half to even, the inverse
  in float32, as every kernel quantizes; fp8: `X · (1 / x_scale)` as float8e4m3fn, saturating), `Wq` is the
  constant weight in that type (`quant`: "int8" or "fp8e4m3") and `Ws` its per-output-channel float32 scales.
  FusedConv over `DequantizeLinear(QuantizeLinear(X))` and the dequantized weight, up to QuantizeLinear's
  division (one step on the rare elements within a float32 rounding of a boundary): the INT8 engine's layer.
  `explicit=1`
  marks one made from the model's own Q/DQ, whose arithmetic the model prescribes (no float fallback).
  Quantized activations between layers: an X already of `quant`'s type is taken as `Q(X)` (not quantized again;
  x_scale is its scale), and a positive float `y_scale` makes the layer write `Q(Y)` on the grid of `quant` with
  that scale (`Y` in float32, then quantized as X is) instead of Y in float (`y_scale` 0, the default; the
  output is then X's float type, float32 for a quantized X). A positive `z_scale` marks a quantized residual:
  Z is of `quant`'s type and adds `Z · z_scale` (the residual stream of a ResNet kept in int8). `passes/quant_chain.py`
  sets them up. `y_range_scale` (positive when calibrated) records the scale calibration found for Y, which
  the chaining takes when Y is a residual that no quantized layer reads as its input; it changes no value.
  `QuantizedConv(X, Wq, B?, Z?, Ws, Xs)`: X quantized per channel: `Q(X)[:, c]` divides by `x_scale · Xs[c]`
  (float32 [C]), and output channel o is dequantized by `x_scale · Xs[o // (Cout / C)] · Ws[o]`. Made for a
  depthwise convolution (group = C, each output channel reads one input channel), where it is exact; its X is
  float (a chained producer writes one scale).
- `QuantizedGemm(A, Bq, C?, Z?, Bs)`: FusedGemm on quantized operands, `Y = post(pre(acc · x_scale · Bs[n] + C)
  + Z)` with `acc = Q(A) @ Bq`: A quantized per tensor as in QuantizedConv, Bq the constant [K, N] weight in
  that type with per-output-column float32 scales Bs (alpha 1, beta 1, A not transposed); A already quantized,
  `y_scale` and a quantized residual (`z_scale`) as in QuantizedConv.
- `FusedGemm(A, B, C?, Z?)`: `Y = post(pre(alpha · op(A) @ op(B) + beta · C) + Z)`, where `@` is MatMul's
  batched matrix product and `op` transposes the last two axes when `transA` / `transB` is set.
- `Attention(Q, Kt, V, B?)`: `Softmax(Q @ Kt · scale + B, axis=-1) @ V` (Kt is Kᵀ, [..., D, Sk]; the float
  attribute `scale`; B an optional additive bias broadcast to the scores). With `transposed=1` (4-D operands) the
  result's axes 1 and 2 are swapped, [B, Sq, H, Dv]: the heads side by side in each query row, as the
  Transpose a multi-head layer applies before merging them.
- `FusedPointwise(X0, X1, ...)`: a small DAG of elementwise ONNX ops in one node (see `pointwise_program`).
- `LayerNormalization`, `Gelu`, `Softmax`: the ONNX ops (opset 17, 20, 13 semantics) in this domain, so the
  optimizer can introduce them into models whose opset predates them. LayerNormalization's positive float
  `y_scale` makes it write `Q(Y)` on the grid of `quant` ("int8" or "fp8e4m3"; Y computed in float32 and
  quantized as a QuantizedConv quantizes X): a transformer's norm handing its quantized layers their input
  (`passes/quant_chain.py`). The domain's norm computes no statistics outputs: its optional second output is Y
  itself in X's float type (rounded once from float32), written beside `Q(Y)` for the readers that add or read Y
  in float (a post-norm transformer's residual adders). So are `QuantizeLinear` and
  `DequantizeLinear` (opset 21 semantics: per-axis and blocked scales), for quantizing models older than
  opset 13.

`pre` and `post` name an activation from `ACTIVATIONS` ("" for none), with its float parameters in
`pre_params` / `post_params`.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F

from ..ir import DType, Node, Value
from .activations import gelu_exact
from .conv import convolution
from .registry import REGISTRY, OpContext, register

DOMAIN = "tensorforge"
OPSET = 1
_POINTWISE_OPSET = 22

Activation = Callable[[torch.Tensor, Sequence[float]], torch.Tensor]

ACTIVATIONS: dict[str, Activation] = {
    "": lambda x, p: x,
    "Relu": lambda x, p: torch.relu(x),
    "Clip": lambda x, p: torch.clamp(x, p[0], p[1]),
    "LeakyRelu": lambda x, p: F.leaky_relu(x, p[0] if p else 0.01),
    "Sigmoid": lambda x, p: torch.sigmoid(x),
    "HardSigmoid": lambda x, p: torch.clamp(x * (p[0] if p else 0.2) + (p[1] if len(p) > 1 else 0.5), 0, 1),
    "HardSwish": lambda x, p: x * torch.clamp(x / 6 + 0.5, 0, 1),
    "SiLU": lambda x, p: x * torch.sigmoid(x),
    "Gelu": lambda x, p: gelu_exact(x),
    "GeluTanh": lambda x, p: gelu_exact(x, "tanh"),
    "Tanh": lambda x, p: torch.tanh(x),
    "Mish": lambda x, p: x * torch.tanh(F.softplus(x)),
    "Elu": lambda x, p: F.elu(x, p[0] if p else 1.0),
}


def apply_activation(x: torch.Tensor, name: str, params: Sequence[float] = ()) -> torch.Tensor:
    try:
        fn = ACTIVATIONS[name]
    except KeyError:
        known = sorted(a for a in ACTIVATIONS if a)
        raise ValueError(f"unknown fused activation {name!r}; known: {known}") from None
    return fn(x, list(params))


def _wide(x: torch.Tensor) -> torch.Tensor:
    return x.float() if x.is_floating_point() and x.element_size() < 4 else x


def epilogue(y, bias, residual, pre, pre_params, post, post_params, bias_shape) -> torch.Tensor:
    """`post(pre(y + bias) + residual)` in at least float32, rounded once to y's type; `bias_shape(bias)` is the
    shape that broadcasts the bias against y."""
    out_dtype = y.dtype
    y = _wide(y)
    if bias is not None:
        y = y + _wide(bias).reshape(bias_shape(bias))
    y = apply_activation(y, pre, pre_params)
    if residual is not None:
        y = y + _wide(residual)
    return apply_activation(y, post, post_params).to(out_dtype)


@register("FusedConv", since=OPSET, domain=DOMAIN)
def fused_conv(
    ctx: OpContext,
    x,
    w,
    b=None,
    z=None,
    *,
    auto_pad="NOTSET",
    dilations=None,
    group=1,
    kernel_shape=None,
    pads=None,
    strides=None,
    pre="",
    pre_params=(),
    post="",
    post_params=(),
):
    y = convolution(x, w, None, auto_pad, dilations, group, pads, strides)
    spatial = y.dim() - 2
    return epilogue(y, b, z, pre, pre_params, post, post_params, lambda t: (-1, *[1] * spatial))


@register("Attention", since=OPSET, domain=DOMAIN)
def attention(ctx: OpContext, q, kt, v, bias=None, *, scale=1.0, transposed=0):
    scores = torch.matmul(_wide(q), _wide(kt))
    if scale != 1.0:
        scores = scores * scale
    if bias is not None:
        scores = scores + _wide(bias)
    y = torch.matmul(torch.softmax(scores, dim=-1), _wide(v)).to(q.dtype)
    return y.transpose(1, 2).contiguous() if transposed else y


QUANT_TYPES = {"int8": DType.INT8, "fp8e4m3": DType.FLOAT8E4M3FN}
QUANTIZED_DTYPES = tuple(QUANT_TYPES.values())
FLOAT_LAYERS = {"QuantizedConv": "FusedConv", "QuantizedGemm": "FusedGemm"}  # the float op each quantizes
QUANT_ATTRIBUTES = ("x_scale", "quant", "explicit", "y_scale", "z_scale", "y_range_scale")  # a float twin drops them


Scale = float | torch.Tensor  # per tensor, or per channel (a float32 tensor of X's channels, axis 1)


def quantize_activation(x: torch.Tensor, x_scale: Scale, quant: str) -> torch.Tensor:
    """`Q(X)` of QuantizedConv: X on the grid of `quant` (as that type), multiplied in float32 by the inverse of the
    scale (one, or one per channel along axis 1), as every kernel quantizes: rounded half to even and saturated
    for int8, to nearest even and saturated (NaN kept) for E4M3. QuantizeLinear divides instead; the two differ
    by one step on the rare elements within a float32 rounding of a boundary of the grid (a few in ten million),
    which a reference that divided would count against every kernel that quantizes a float input."""
    if quant not in QUANT_TYPES:
        raise ValueError(f"unknown quantized type {quant!r}; known: {sorted(QUANT_TYPES)}")
    if isinstance(x_scale, torch.Tensor):
        scale = x_scale.to(device=x.device, dtype=torch.float32).reshape(-1)
        inverse = (1.0 / scale).reshape(1, -1, *[1] * (x.dim() - 2))
    else:
        inverse = torch.full((), 1.0 / x_scale, dtype=torch.float32, device=x.device)
    scaled = x.to(torch.float32) * inverse
    if quant == "int8":
        return scaled.round_().clamp_(-128, 127).to(torch.int8)
    return scaled.clamp_(-448.0, 448.0).to(QUANT_TYPES[quant].torch)


def is_quantized_tensor(x: torch.Tensor) -> bool:
    """Whether `x` holds quantized values (int8 or float8) rather than real ones."""
    return not x.is_floating_point() or x.element_size() == 1


def quantized_input(x: torch.Tensor, x_scale: Scale, quant: str) -> torch.Tensor:
    """`Q(X)` as float32 values (exact: integers and E4M3 values are float32 numbers): X quantized, or X itself
    when it already is of `quant`'s type (a quantized activation from the layer before)."""
    if quant not in QUANT_TYPES:
        raise ValueError(f"unknown quantized type {quant!r}; known: {sorted(QUANT_TYPES)}")
    if is_quantized_tensor(x):
        if x.dtype != QUANT_TYPES[quant].torch:
            raise ValueError(f"a {quant} layer reads a quantized input of its own type, not {x.dtype}")
        return x.float()
    return quantize_activation(x, x_scale, quant).float()


def input_scale(x_scale: float, x_channel_scale: torch.Tensor | None) -> Scale:
    """The scale QuantizedConv quantizes X with: `x_scale`, or `x_scale · Xs` per channel."""
    if x_channel_scale is None:
        return float(x_scale)
    return x_channel_scale.float() * torch.tensor(x_scale, dtype=torch.float32, device=x_channel_scale.device)


def dequantize_scales(w_scale: torch.Tensor, x_scale: float, x_channel_scale: torch.Tensor | None) -> torch.Tensor:
    """float32 [Cout] factors of a QuantizedConv's accumulator: `x_scale · Ws[o]`, times `Xs[o // (Cout / C)]` with
    per-channel input scales (module docstring)."""
    scales = w_scale.float() * torch.tensor(x_scale, dtype=torch.float32, device=w_scale.device)
    if x_channel_scale is None:
        return scales
    per_input = scales.numel() // x_channel_scale.numel()
    return scales * x_channel_scale.float().to(w_scale.device).repeat_interleave(per_input)


def dequantized_weight(op_type: str, wq: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """A quantized layer's weight in float32, `Wq · Ws`: QuantizedConv weights are [Cout, ...] with scales over
    axis 0, QuantizedGemm weights [K, N] with scales over axis 1."""
    if op_type == "QuantizedGemm":
        return wq.float() * scales.float().reshape(1, -1)
    return wq.float() * scales.float().reshape(-1, *[1] * (wq.dim() - 1))


def residual_values(z: torch.Tensor | None, z_scale: float) -> torch.Tensor | None:
    """A quantized layer's residual as real values: `Z · z_scale` in float32 for a quantized Z (`z_scale` > 0),
    else Z as it is."""
    if z is None or not z_scale:
        return z
    if not is_quantized_tensor(z):
        raise ValueError(f"a residual with z_scale {z_scale:g} must be quantized, got {z.dtype}")
    return z.float() * z_scale


def output_dtype(x: torch.Tensor) -> torch.dtype:
    """The float type of a quantized layer's unquantized output: X's, float32 when X is quantized."""
    return torch.float32 if is_quantized_tensor(x) else x.dtype


def requantize(y: torch.Tensor, y_scale: float, quant: str, dtype: torch.dtype) -> torch.Tensor:
    """A quantized layer's output: `Q(Y)` with `y_scale` as `quantize_activation` does it, or Y as `dtype` when
    `y_scale` is 0 (float output)."""
    if not y_scale:
        return y.to(dtype)
    return quantize_activation(y, y_scale, quant)


@register("QuantizedConv", since=OPSET, domain=DOMAIN)
def quantized_conv(
    ctx: OpContext,
    x,
    w,
    b=None,
    z=None,
    w_scale=None,
    x_channel_scale=None,
    *,
    x_scale,
    quant="int8",
    explicit=0,
    y_scale=0.0,
    z_scale=0.0,
    y_range_scale=0.0,
    auto_pad="NOTSET",
    dilations=None,
    group=1,
    kernel_shape=None,
    pads=None,
    strides=None,
    pre="",
    pre_params=(),
    post="",
    post_params=(),
):
    if w_scale is None:
        raise ValueError("QuantizedConv needs the weight scales (input 4)")
    scale = input_scale(x_scale, x_channel_scale)
    # Integer values (and fp8 values) are exact in float32; the sum of their products is float32's.
    acc = convolution(quantized_input(x, scale, quant), w.float(), None, auto_pad, dilations, group, pads, strides)
    spatial = acc.dim() - 2
    scales = dequantize_scales(w_scale, x_scale, x_channel_scale).reshape(-1, *[1] * spatial)
    z = residual_values(z, z_scale)
    y = epilogue(acc * scales.to(acc.device), b, z, pre, pre_params, post, post_params, lambda t: (-1, *[1] * spatial))
    return requantize(y, y_scale, quant, output_dtype(x))


@register("QuantizedGemm", since=OPSET, domain=DOMAIN)
def quantized_gemm(
    ctx: OpContext, a, b, c=None, z=None, b_scale=None, *, x_scale, quant="int8", explicit=0, y_scale=0.0,
    z_scale=0.0, pre="", pre_params=(), post="", post_params=(),
):  # fmt: skip
    if b_scale is None:
        raise ValueError("QuantizedGemm needs the weight scales (input 4)")
    acc = torch.matmul(quantized_input(a, x_scale, quant), b.float())
    scales = b_scale.float().to(acc.device) * torch.full((), x_scale, dtype=torch.float32, device=acc.device)
    z = residual_values(z, z_scale)
    y = epilogue(acc * scales, c, z, pre, pre_params, post, post_params, lambda t: t.shape)
    return requantize(y, y_scale, quant, output_dtype(a))


@register("FusedGemm", since=OPSET, domain=DOMAIN)
def fused_gemm(
    ctx: OpContext,
    a,
    b,
    c=None,
    z=None,
    *,
    alpha=1.0,
    beta=1.0,
    transA=0,
    transB=0,
    pre="",
    pre_params=(),
    post="",
    post_params=(),
):
    a = a.transpose(-1, -2) if transA else a
    b = b.transpose(-1, -2) if transB else b
    y = torch.matmul(a, b)
    if alpha != 1.0:
        y = y * alpha
    if c is not None and beta != 1.0:
        c = c * beta
    return epilogue(y, c, z, pre, pre_params, post, post_params, lambda t: t.shape)


# -- FusedPointwise ---------------------------------------------------------------------------------------


def pointwise_program(steps: Sequence[tuple[str, Sequence[int], dict[str, Any]]]) -> str:
    """Serialize a pointwise DAG for the `program` attribute of `FusedPointwise`.

    Each step is `(op_type, operand indices, attributes)`: operands 0..n-1 are the node's inputs, operand
    n + i is the result of step i. The node's outputs are listed in its `outputs` attribute (step results by
    operand index), the last step by default.
    """
    return json.dumps([[op, list(args), dict(attrs)] for op, args, attrs in steps], separators=(",", ":"))


def parse_program(program: str) -> list[tuple[str, list[int], dict[str, Any]]]:
    return [(op, list(args), dict(attrs)) for op, args, attrs in json.loads(program)]


@functools.lru_cache(maxsize=4096)
def _compiled(program: str) -> tuple[tuple[str, Any, list[int], dict[str, Any]], ...]:
    """The program's steps with their implementations looked up: parsed once per program, not per run."""
    steps = []
    for op_type, operands, attrs in parse_program(program):
        op_def = REGISTRY.lookup(op_type, "", _POINTWISE_OPSET)
        if op_def is None:
            raise ValueError(f"FusedPointwise step {op_type} is not a known op")
        steps.append((op_type, op_def.impl, operands, attrs))
    return tuple(steps)


@register("FusedPointwise", since=OPSET, domain=DOMAIN)
def fused_pointwise(ctx: OpContext, *inputs, program: str, outputs=None):
    """Evaluate the program step by step with the registry's elementwise ops (ONNX semantics)."""
    values: list[Any] = list(inputs)
    for op_type, impl, operands, attrs in _compiled(program):
        step_ctx = _step_context(ctx, op_type, operands, values)
        values.append(impl(step_ctx, *[values[i] for i in operands], **attrs))
    wanted = outputs if outputs else [len(values) - 1]
    results = tuple(values[i] for i in wanted)
    return results if len(results) > 1 else results[0]


def _step_context(ctx: OpContext, op_type: str, operands: Sequence[int], values: Sequence[Any]) -> OpContext:
    """The context of one step: its node's inputs carry the operands' element types (Cast reads them)."""
    inputs = ctx.node.inputs
    step_inputs = [Value(f"operand{i}", inputs[i].dtype if i < len(inputs) else _dtype_of(values[i])) for i in operands]
    node = Node(op_type, step_inputs, [Value("result")])
    return dataclasses.replace(ctx, node=node, output_dtypes=())


def _dtype_of(value: Any) -> DType:
    try:
        return DType.from_torch(value.dtype)
    except (AttributeError, TypeError):
        return DType.UNDEFINED


# -- ONNX ops re-exported into the tensorforge domain ---------------------------------------------------


@register("LayerNormalization", since=OPSET, domain=DOMAIN)
def layer_normalization(
    ctx: OpContext, x, scale, bias=None, *, axis=-1, epsilon=1e-5, stash_type=1, y_scale=0.0, quant="int8"
):  # fmt: skip
    """ONNX's LayerNormalization writing Y, or `Q(Y)` for a positive `y_scale`, and Y in X's type as an optional
    second output (no Mean or InvStdDev)."""
    impl = REGISTRY.lookup("LayerNormalization", "", 17).impl
    if ctx.num_outputs > 2:
        raise ValueError("the tensorforge domain's LayerNormalization writes Y (or Q(Y)) and Y, no statistics")
    alone = ctx if ctx.num_outputs == 1 else dataclasses.replace(ctx, node=Node("LayerNormalization", [], [Value("y")]))
    if not y_scale:
        y = impl(alone, x, scale, bias, axis=axis, epsilon=epsilon, stash_type=stash_type)
        return (y, y) if ctx.num_outputs == 2 else y
    if stash_type != 1:
        raise ValueError("a LayerNormalization with y_scale computes Y from float32 statistics (stash_type 1)")
    as_float = (t if t is None else t.float() for t in (x, scale, bias))
    y = impl(alone, *as_float, axis=axis, epsilon=epsilon, stash_type=stash_type)
    quantized = quantize_activation(y, y_scale, quant)
    return (quantized, y.to(x.dtype)) if ctx.num_outputs == 2 else quantized


@register("Gelu", since=OPSET, domain=DOMAIN)
def gelu(ctx: OpContext, x, *, approximate="none"):
    return REGISTRY.lookup("Gelu", "", 20).impl(ctx, x, approximate=approximate)


@register("Softmax", since=OPSET, domain=DOMAIN)
def softmax(ctx: OpContext, x, *, axis=-1):
    return REGISTRY.lookup("Softmax", "", 13).impl(ctx, x, axis=axis)


@register("QuantizeLinear", since=OPSET, domain=DOMAIN)
def quantize_linear(ctx: OpContext, x, y_scale, y_zero_point=None, *, axis=1, saturate=1, block_size=0, output_dtype=0):
    impl = REGISTRY.lookup("QuantizeLinear", "", 21).impl
    return impl(
        ctx, x, y_scale, y_zero_point, axis=axis, saturate=saturate, block_size=block_size, output_dtype=output_dtype
    )


@register("DequantizeLinear", since=OPSET, domain=DOMAIN)
def dequantize_linear(ctx: OpContext, x, x_scale, x_zero_point=None, *, axis=1, block_size=0):
    impl = REGISTRY.lookup("DequantizeLinear", "", 21).impl
    return impl(ctx, x, x_scale, x_zero_point, axis=axis, block_size=block_size)
