"""The Gluon tactics (Hopper): `kernels.gluon.gemm`'s warp-specialized persistent GEMM, whose producer warp keeps
TMA loads of the next tiles in flight while the consumer warpgroups multiply and finish tiles.

- `gluon.gemm-ws`: a linear layer (FusedGemm, Gemm or MatMul by a constant 2-D weight; every batch dimension
  folds into the rows) in fp16 / bf16, bias, activations and residual in the epilogue.
- `gluon.gemm-ws-quantized`: the same for a QuantizedGemm whose input is already of the layer's quantized type
  (from a quantized layer or a layer norm that writes it): int32 sums (float32 for E4M3) times x_scale ·
  Bs[n], the epilogue, the output quantized with y_scale or written in float.
- `gluon.conv-ws`: a FusedConv of one group, stride 1 or 2, over channels_last activations (`conv_ws`: an unpadded
  1×1 as a product of pixel rows, any other in boxes of output pixels whose taps read shifted boxes of the input,
  or of one of its four phases at stride 2).
- `gluon.conv-ws-quantized`: the same for QuantizedConv whose input is already of the layer's quantized type
  (an int8 or E4M3 chain): the per-channel weight scales times x_scale, a quantized or float residual, the output
  quantized with y_scale or written in float.

They decline on the CPU, before Hopper, and where this Triton has no Gluon; a call whose tensors the kernel
cannot take (unaligned rows, a tile that does not fit in shared memory) raises, and the autotuner scores it
`inf`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ..ir import Node, qualified_op
from ..kernels.triton.conv_tma import hopper_problem
from ..kernels.triton.epilogue import quant_code
from ..ops.fused import DOMAIN, QUANT_TYPES
from ..ops.pool import ConvWindows
from .base import Kernel, PerWeight, Tactic, allocate, register_tactic
from .triton_conv import _activations as node_activations
from .triton_conv import accumulations
from .variant import float_type

try:
    from ..kernels.gluon.gemm import SHARED_LIMIT, GemmConfig, conv_ws, gemm_ws, pack_conv_weight
except ImportError as missing:  # a Triton without Gluon's Hopper language (before 3.6)
    GemmConfig = conv_ws = gemm_ws = pack_conv_weight = SHARED_LIMIT = None
    _GLUON_MISSING = f"this Triton has no Gluon for Hopper ({missing})"
else:
    _GLUON_MISSING = ""

_FUSED_GEMM = f"{DOMAIN}::FusedGemm"

# (block_m, block_n, block_k, stages, consumers, num_warps) by effort; 8-bit operands take twice the K step.
_SPACE = {
    0: [(128, 128, 64, 4, 1, 4), (128, 128, 64, 3, 2, 4), (128, 256, 64, 3, 1, 8)],
    1: [(128, 64, 64, 4, 1, 4), (64, 128, 64, 4, 1, 4), (128, 128, 64, 2, 2, 4), (128, 64, 64, 4, 2, 4)],
}
_FIELDS = ("block_m", "block_n", "block_k", "stages", "consumers", "num_warps")


def gemm_ws_configs(effort: int, quantized: bool = False) -> list[dict[str, Any]]:
    """The tuning space at `effort` (each level adds to the one below)."""
    rows = [row for level in sorted(_SPACE) if level <= effort for row in _SPACE[level]]
    configs = [dict(zip(_FIELDS, row, strict=True)) for row in rows]
    if quantized:
        for config in configs:
            config["block_k"] *= 2
    return configs


def gemm_config(config: dict[str, Any]) -> GemmConfig:
    return GemmConfig(**{field: config[field] for field in _FIELDS}, promote=config.get("promote", True))


def float_out(dtype: torch.dtype, n: int) -> torch.dtype:
    """The type a quantized layer writes a float output of `n` columns in: its variant's, or float32 where TMA
    cannot store rows of `n` such elements (16 bytes at least; the variant's wrapper then casts it)."""
    return dtype if n * dtype.itemsize % 16 == 0 else torch.float32


@dataclass(frozen=True)
class QuantizedEpilogue:
    """A quantized layer's epilogue terms, worked out once at build: the column factors x_scale · Ws (per weight
    scale tensor), the output's quantize code (0: written in float) and inverse scale, the residual's z_scale (0:
    none given) and the output's type (float in the variant's type, `float_out`, for `columns` output columns)."""

    column_scales: PerWeight
    quant_y: int
    y_inv_scale: float
    z_scale: float
    out_type: torch.dtype

    @classmethod
    def of(cls, node: Node, config: dict[str, Any], columns: int) -> QuantizedEpilogue:
        a = node.attributes
        x_scale, y_scale = float(a.get("x_scale", 1.0)), float(a.get("y_scale", 0.0))
        quant = a.get("quant", "int8")
        quant_y = quant_code(quant) if y_scale else 0
        return cls(
            column_scales=PerWeight(lambda s: (s.double() * x_scale).float().contiguous()),
            quant_y=quant_y,
            y_inv_scale=1.0 / y_scale if quant_y else 1.0,
            z_scale=float(a.get("z_scale", 0.0)),
            out_type=QUANT_TYPES[quant].torch if quant_y else float_out(float_type(config), columns),
        )

    def conv_args(self, w: torch.Tensor, w_scale: torch.Tensor, z: torch.Tensor | None) -> dict[str, Any]:
        """`conv_ws`'s quantized keywords for a call: a residual of the weight's quantized type is dequantized by
        z_scale, a float one added as it is."""
        quantized_z = z is not None and z.dtype == w.dtype
        return dict(
            scale=self.column_scales(w_scale), z_scale=self.z_scale if quantized_z else 1.0, quant_y=self.quant_y,
            y_inv_scale=self.y_inv_scale,
        )  # fmt: skip


def _no_wider(configs: list[dict[str, Any]], columns: Any) -> list[dict[str, Any]]:
    """`configs` for a product of `columns` output columns: a layer of at most 64 (ResNet's 256 → 64 and 3×3
    64 → 64 layers) takes each tile 64 columns wide, since a 128- or 256-column tile would multiply zeros for
    half or more of its products and hold their accumulators (duplicates dropped, in order)."""
    if not isinstance(columns, int) or columns > 64:
        return configs
    narrowed: list[dict[str, Any]] = []
    for config in configs:
        config = {**config, "block_n": min(config["block_n"], 64)}
        if config not in narrowed:
            narrowed.append(config)
    return narrowed


def _fitting(
    node: Node, configs: list[dict[str, Any]], quantized: bool, widest: torch.dtype = torch.float32
) -> list[dict[str, Any]]:
    """The configs whose rings fit in shared memory for `node` in any precision the tactic runs it: a float
    layer's tensors are 16-bit; a quantized one's operands 8-bit, its float output and a float residual up to
    `widest` (the widest float type of its variants)."""
    if GemmConfig is None:
        return configs
    residual = len(node.inputs) > 3 and node.inputs[3] is not None
    a = node.attributes
    if quantized:
        operands = torch.int8
        weight = node.inputs[1].shape
        n = weight[1] if qualified_op(node) == f"{DOMAIN}::QuantizedGemm" else weight[0]
        y = torch.int8 if float(a.get("y_scale", 0.0)) else float_out(widest, n)
        z = torch.int8 if float(a.get("z_scale", 0.0)) else widest
    else:
        operands = y = z = torch.float16
    return [c for c in configs if gemm_config(c).shared_bytes(operands, y, z if residual else None) <= SHARED_LIMIT]


def device_problem(device: torch.device) -> str | None:
    if device.type != "cuda":
        return "needs CUDA"
    if _GLUON_MISSING:
        return _GLUON_MISSING
    return hopper_problem(device)


def _activations(node: Node) -> str | None:
    """Why the node's pre or post activation has no epilogue code, or None."""
    try:
        node_activations(node)
    except ValueError as err:
        return str(err)
    return None


def epilogue_args(node: Node) -> dict[str, tuple[int, float, float]]:
    return dict(zip(("pre", "post"), node_activations(node), strict=True))


def _unpadded_1x1(node: Node) -> bool:
    a = node.attributes
    return (
        tuple(node.inputs[1].shape[2:]) == (1, 1)
        and not any(a.get("pads", ()))
        and a.get("auto_pad", "NOTSET") in ("NOTSET", "VALID")
    )


def conv_problem(node: Node) -> str | None:
    """Why `node` is not a 2-D convolution of one group by a constant weight, of stride 1 or 2 or an unpadded 1×1
    (a stride-2 one reads the input's four phases, a strided 1×1 every s-th input pixel: views TMA reads through
    their strides)."""
    a, weight = node.attributes, node.inputs[1]
    if not weight.is_const or weight.rank != 4:
        return "2-D convolutions by a constant weight only"
    if a.get("group", 1) != 1:
        return "one group only"
    if tuple(a.get("strides", (1, 1))) not in ((1, 1), (2, 2)) and not _unpadded_1x1(node):
        return "stride 1 or 2 along both axes only, or an unpadded 1×1 (a box of output pixels reads shifted boxes)"
    return _activations(node)


def _quantized_input_problem(node: Node) -> str | None:
    quant = node.attributes.get("quant", "int8")
    if node.inputs[0].dtype != QUANT_TYPES[quant]:
        return f"an input already of the layer's {quant} type only (a quantized chain), not {node.inputs[0].dtype}"
    if len(node.inputs) > 5 and node.inputs[5] is not None:
        return "per-tensor input scales only (no per-channel Xs)"
    return None


@register_tactic
class GluonGemmTactic(Tactic):
    """`Y = post(pre(A @ B + C) + Z)` for a linear layer: B a constant [K, N] (or [N, K] with transB) weight kept
    K-major, C absent or a constant vector over the N columns, alpha = beta = 1."""

    family = "gluon"
    name = "gemm-ws"
    op_types = ("MatMul", "Gemm", _FUSED_GEMM)
    precisions = ("fp16", "bf16")
    writes_into = True
    adds_quantized_residual = True  # a `z_scale` on the node: Z arrives 8-bit, added as Z · z_scale

    def supports(self, node: Node, opset: int, device: torch.device) -> str | None:
        problem = device_problem(device)
        if problem:
            return problem
        a, b = node.inputs[0], node.inputs[1]
        if not (b.is_const and b.rank == 2) or a.rank is None or a.rank < 2:
            return "a matrix (or batch of them) times a constant 2-D weight only (a linear layer)"
        attributes = node.attributes
        if node.op_type == "MatMul":
            return None
        if attributes.get("transA", 0) or float(attributes.get("alpha", 1.0)) != 1.0:
            return "alpha = 1 and an untransposed A only"
        c = node.inputs[2] if len(node.inputs) > 2 else None
        if c is not None and (not c.is_const or c.rank != 1 or float(attributes.get("beta", 1.0)) != 1.0):
            return "C must be absent or a constant bias vector (beta = 1)"
        return _activations(node) if qualified_op(node) == _FUSED_GEMM else None

    def space(self, effort: int) -> list[dict[str, Any]]:
        return gemm_ws_configs(effort)

    def space_for(self, node: Node, effort: int) -> list[dict[str, Any]]:
        return _fitting(node, self.space(effort), quantized=False)

    def build(self, node: Node, opset: int, device: torch.device, config: dict[str, Any]) -> Kernel:
        trans_b = bool(node.attributes.get("transB", 0)) and node.op_type != "MatMul"
        epilogue = epilogue_args(node) if qualified_op(node) == _FUSED_GEMM else {}
        z_scale = float(node.attributes.get("z_scale", 0.0))
        k_major = PerWeight(lambda w: (w if trans_b else w.T).contiguous())
        tiles = gemm_config(config)

        def kernel(inputs, alloc=None):
            a, w, c, z = (list(inputs) + [None] * 4)[:4]
            b = k_major(w)
            out = allocate(alloc, 0, (*a.shape[:-1], b.shape[0]), a.dtype, a.device)
            rows = a.reshape(-1, a.shape[-1])
            z_rows = z.reshape(-1, b.shape[0]) if z is not None else None
            gemm_ws(rows, b, out.view(-1, b.shape[0]), tiles, bias=c, z=z_rows, z_scale=z_scale or 1.0, **epilogue)
            return (out,)

        return kernel


@register_tactic
class GluonQuantizedGemmTactic(Tactic):
    """`gluon.gemm-ws` for a QuantizedGemm `Y = post(pre(Σ q_a·q_b · x_scale · Bs[n] + C) + Z)` whose A is already
    quantized: the weight [K, N] kept K-major ([N, K]) once, the column factors x_scale · Bs once, a float
    residual or a quantized one dequantized by z_scale, the output requantized with y_scale (or written in the
    variant's float type, float32 where its rows are too narrow for TMA)."""

    family = "gluon"
    name = "gemm-ws-quantized"
    op_types = (f"{DOMAIN}::QuantizedGemm",)
    precisions = ("fp16", "bf16")  # a float32 output and residual leave the rings too little shared memory
    writes_into = True
    sees_precision = True  # a float output in the variant's type

    def supports(self, node: Node, opset: int, device: torch.device) -> str | None:
        problem = device_problem(device)
        if problem:
            return problem
        b = node.inputs[1]
        if not (b.is_const and b.rank == 2) or node.inputs[0].rank is None:
            return "a matrix (or batch of them) times a constant 2-D weight only"
        return _quantized_input_problem(node) or _activations(node)

    def space(self, effort: int) -> list[dict[str, Any]]:
        return gemm_ws_configs(effort, quantized=True)

    def space_for(self, node: Node, effort: int) -> list[dict[str, Any]]:
        return accumulations(node, _fitting(node, self.space(effort), quantized=True, widest=torch.float16))

    def build(self, node: Node, opset: int, device: torch.device, config: dict[str, Any]) -> Kernel:
        epilogue = epilogue_args(node)
        k_major = PerWeight(lambda w: w.T.contiguous())
        tiles = gemm_config(config)
        n = node.inputs[1].shape[1]
        terms = QuantizedEpilogue.of(node, config, n)

        def kernel(inputs, alloc=None):
            x, w, c, z, w_scale = (list(inputs) + [None] * 5)[:5]
            b = k_major(w)
            out = allocate(alloc, 0, (*x.shape[:-1], n), terms.out_type, x.device)
            gemm_ws(
                x.reshape(-1, x.shape[-1]), b, out.view(-1, n), tiles, scale=terms.column_scales(w_scale), bias=c,
                z=z.reshape(-1, n) if z is not None else None, z_scale=terms.z_scale or 1.0, quant_y=terms.quant_y,
                y_inv_scale=terms.y_inv_scale, **epilogue,
            )  # fmt: skip
            return (out,)

        return kernel


@register_tactic
class GluonConvTactic(Tactic):
    """A FusedConv of one group, stride 1 or 2, through `conv_ws`; the weight packed [C_out, KH·KW·C] once."""

    family = "gluon"
    name = "conv-ws"
    op_types = (f"{DOMAIN}::FusedConv",)
    precisions = ("fp16", "bf16")
    layouts = ("NHWC",)
    sees_precision = True  # the quantized subclass: a float output in the variant's type
    writes_into = True
    quantized = False

    def supports(self, node: Node, opset: int, device: torch.device) -> str | None:
        return device_problem(device) or conv_problem(node)

    def space(self, effort: int) -> list[dict[str, Any]]:
        return gemm_ws_configs(effort, quantized=self.quantized)

    def space_for(self, node: Node, effort: int) -> list[dict[str, Any]]:
        space = _no_wider(self.space(effort), node.inputs[1].shape[0])
        return accumulations(node, _fitting(node, space, quantized=self.quantized))

    def build(self, node: Node, opset: int, device: torch.device, config: dict[str, Any]) -> Kernel:
        windows = ConvWindows.of(node.attributes)
        epilogue = epilogue_args(node)
        packed = PerWeight(pack_conv_weight)
        tiles = gemm_config(config)
        terms = QuantizedEpilogue.of(node, config, node.inputs[1].shape[0]) if self.quantized else None

        def kernel(inputs, alloc=None):
            x, w, b, z, w_scale = (list(inputs) + [None] * 5)[:5]
            x = x.contiguous(memory_format=torch.channels_last)
            begin, _, out_hw = windows.at(x.shape[2:], w.shape[2:])
            out_dtype = terms.out_type if terms else x.dtype
            out = allocate(alloc, 0, (x.shape[0], w.shape[0], *out_hw), out_dtype, x.device, torch.channels_last)
            z = z.contiguous(memory_format=torch.channels_last) if z is not None else None
            conv_ws(
                x, packed(w), out, tiles, kernel=tuple(w.shape[2:]), strides=tuple(windows.strides), pads=tuple(begin),
                dilations=tuple(windows.dilations), bias=b, z=z, **(terms.conv_args(w, w_scale, z) if terms else {}),
                **epilogue,
            )  # fmt: skip
            return (out,)

        return kernel


@register_tactic
class GluonQuantizedConvTactic(GluonConvTactic):
    """`gluon.conv-ws` for a QuantizedConv whose input is already of its quantized type: products of the quantized
    values (int32 sums for int8, float32 for E4M3) times x_scale · w_scale[c], then the epilogue, a quantized
    residual dequantized by z_scale, the output requantized with y_scale (or written in float)."""

    name = "conv-ws-quantized"
    op_types = (f"{DOMAIN}::QuantizedConv",)
    precisions = ("fp16", "bf16", "fp32")
    quantized = True

    def supports(self, node: Node, opset: int, device: torch.device) -> str | None:
        return super().supports(node, opset, device) or _quantized_input_problem(node)
