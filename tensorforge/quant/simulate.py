"""Simulated INT8 and FP8: QuantizeLinear → DequantizeLinear pairs in front of every quantizable layer.

For an operand `x` of a quantized layer, the layer reads `DQ(Q(x)) = clip(round(x / s), −128, 127) · s` (int8, zero
point 0, ONNX's saturation: with `s = amax / 127` only values below `−127.5 s` reach −128) instead of `x`:
activations with their calibrated per-tensor scale, weights with per-output-channel scales (`weights.py`); a
depthwise convolution's input per channel (axis 1) when the table has its channel ranges, as the lowering quantizes
it (`lower.channel_scales`). For float8 E4M3 (`quant="fp8e4m3"`) the pair rounds `x / s` to the nearest E4M3 value,
saturated to ±448, with `s = amax / 448`, as the FP8 kernels do. Run by the reference executor this gives, on any
device, the numerics of a quantized engine that accumulates `Σ q_x · q_w` exactly and rescales by `s_x · s_w[c]`
before the float bias and epilogue: the CPU path of a quantized engine and what the GPU kernels must match. An
activation read by several quantized layers gets one shared pair; layers named in `keep_float` read float. Scales
have the operand's float type. Models older than opset 13 (whose Q/DQ lack `axis`), or 19 for float8, get the
tensorforge-domain Q/DQ, which follow opset 21.

With `residuals=True` the simulation also rounds the residuals a chained engine adds from their quantized value
(`passes.quant_chain`'s residual streams): where the chaining rules (`ops.chain_rules`, applied to the layers
`quantize_layers` would make with the same `keep_float`, `lower.engine_layers`) give a FusedConv a quantized
residual Z = T, that layer's Z reads the same DQ(Q(T)) its X readers read, so it adds `Q_s(T) · s` as the
engine does. In a graph optimized as the builder does, the residual is the FusedConv's input 3 (epilogue
fusion has folded the Add into it); an unfused Conv followed by Add is not a layer the engine quantizes and
stays as it is. The rules are those of a chaining everywhere the graph allows: an engine chained only between
some layers (`eligible`, the builder's second chaining attempt), or not chained, rounds a subset of these
residuals (a layer closer to float, as a quantized layer run as its float original is).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from ..errors import InputError
from ..ir import DType, Model, Node, Value, validate
from ..ir.clone import clone_model
from ..kernels.quantize import KINDS
from ..ops.chain_rules import Z_INPUT, plan_chains
from ..ops.fused import DOMAIN, OPSET
from ..passes.base import Pass, PassContext
from ..passes.utils import add_initializer
from .calibration import CalibrationTable
from .fingerprint import model_fingerprint
from .layers import Operand, QuantLayer, quantizable_layers
from .lower import channel_scales, engine_layers
from .weights import weight_scales

QDQ_OPSET = {"int8": 13, "fp8e4m3": 19}  # the first ONNX opset whose QuantizeLinear takes `axis` / float8
_STORAGE = {"int8": DType.INT8, "fp8e4m3": DType.FLOAT8E4M3FN}


class InsertQDQ(Pass):
    """Insert Q/DQ pairs of type `quant` ("int8" or "fp8e4m3") on the operands of every quantizable layer not
    in `keep_float`."""

    name = "insert-qdq"

    def __init__(
        self, table: CalibrationTable, keep_float: Iterable[str] = (), quant: str = "int8", residuals: bool = False
    ) -> None:
        if quant not in KINDS:
            raise InputError(f"unknown quantized type {quant!r}: choose from {sorted(KINDS)}")
        self.table = table
        self.keep_float = frozenset(keep_float)
        self.quant = quant
        self.qmax = KINDS[quant][1]
        self.residuals = residuals  # also round the residuals a chained engine adds quantized (module docstring)

    def run(self, ctx: PassContext) -> bool:
        layers = quantizable_layers(ctx.model)
        unknown = sorted(self.keep_float - {layer.name for layer in layers})
        if unknown:
            known = [layer.name for layer in layers]
            raise InputError(f"keep_float names unknown layers {unknown}; the quantizable layers are {known}")
        # The chains, planned on the graph before any pair is inserted (the rules read the layers' readers).
        adders = rounded_residuals(ctx.model, self.table, self.keep_float, self.quant) if self.residuals else {}
        domain = "" if ctx.opset() >= QDQ_OPSET[self.quant] else DOMAIN
        shared: dict[Value, Value] = {}  # an activation's per-tensor pair
        per_channel: dict[Value, Value] = {}  # a depthwise input's per-channel pair
        changed = False
        for layer in layers:
            if layer.name in self.keep_float:
                continue
            channels = channel_scales(self.table, layer, self.quant)
            for operand in layer.operands:
                if operand.is_weight:
                    fake = self._fake_weight(ctx, layer, operand, domain)
                elif channels is not None:
                    fake = per_channel.get(operand.value)
                    if fake is None:
                        fake = per_channel[operand.value] = self._fake_channels(ctx, operand.value, channels, domain)
                else:
                    fake = shared.get(operand.value)
                    if fake is None:
                        fake = shared[operand.value] = self._fake_activation(ctx, operand.value, domain)
                layer.node.set_input(operand.index, fake)
                changed = True
        for adder, (scale, quant) in adders.items():
            residual = adder.inputs[Z_INPUT]
            fake = shared.get(residual)
            if fake is None or quant != self.quant or self._activation_scale(residual) != scale:
                # its X readers are all layers of a model's own Q/DQ, with their own scale and type
                fake = shared[residual] = self._fake_activation(ctx, residual, domain, scale, quant)
            adder.set_input(Z_INPUT, fake)
            changed = True
        if changed and domain:
            ctx.model.opset_imports.setdefault(DOMAIN, OPSET)
        return changed

    def _activation_scale(self, value: Value) -> float:
        return self.table.scale(value.name, self.qmax)

    def _fake_activation(
        self, ctx: PassContext, value: Value, domain: str, scale: float | None = None, quant: str | None = None
    ) -> Value:
        tensor = torch.tensor(self._activation_scale(value) if scale is None else scale, dtype=value.dtype.torch)
        return _qdq(ctx, value, tensor, None, domain, value.name, _STORAGE[quant or self.quant])

    def _fake_channels(self, ctx: PassContext, value: Value, scales: torch.Tensor, domain: str) -> Value:
        return _qdq(ctx, value, scales.to(value.dtype.torch), 1, domain, value.name, _STORAGE[self.quant])

    def _fake_weight(self, ctx: PassContext, layer: QuantLayer, operand: Operand, domain: str) -> Value:
        weight = operand.value
        scales = weight_scales(weight.const, operand.axis, self.qmax).to(weight.dtype.torch)
        if operand.axis is None:
            scales = scales.reshape(())
        hint = f"{layer.name}.w{operand.index}"
        return _qdq(ctx, weight, scales, operand.axis, domain, hint, _STORAGE[self.quant])


def rounded_residuals(
    model: Model, table: CalibrationTable, keep_float: Iterable[str] = (), quant: str = "int8"
) -> dict[Node, tuple[float, str]]:
    """The layers a chained engine of `model` gives a quantized residual, with its `z_scale` and type."""
    layers = engine_layers(model, table, keep_float=keep_float, quant=quant)
    adders = plan_chains(model.graph, layers.get).adders
    return {adder: (scale, layers[adder].quant) for adder, scale in adders.items()}


def simulate_quantized(
    model: Model,
    table: CalibrationTable,
    *,
    quant: str = "int8",
    keep_float: Iterable[str] = (),
    verify: bool = True,
    residuals: bool = False,
) -> Model:
    """A copy of `model` with Q/DQ of type `quant` ("int8" or "fp8e4m3") in front of its quantizable layers
    (those in `keep_float` stay float); with `residuals`, also on the residuals a chained engine adds from
    their quantized value (module docstring). With `verify`, the table must have been calibrated on this very
    model."""
    if verify:
        fingerprint = model_fingerprint(model)
        if table.fingerprint != fingerprint:
            raise InputError(
                f"the calibration table was computed for another model (fingerprint {table.fingerprint}, this "
                f"model has {fingerprint}): calibrate this model"
            )
    copy = clone_model(model)
    InsertQDQ(table, keep_float, quant, residuals).run(PassContext(copy))
    copy.graph.sort()
    validate(copy.graph)
    return copy


def _qdq(
    ctx: PassContext, source: Value, scale: torch.Tensor, axis: int | None, domain: str, hint: str, storage: DType
) -> Value:
    graph = ctx.model.graph
    scale_value = add_initializer(graph, ctx.new_value(f"{hint}.scale"), scale)
    zero = torch.zeros(scale.shape, dtype=storage.torch)
    zero_value = add_initializer(graph, ctx.new_value(f"{hint}.zero_point"), zero)
    attributes = {} if axis is None else {"axis": axis}
    quantized = Value(ctx.fresh_name(f"{hint}.{storage.name.lower()}"), storage, source.shape)
    restored = Value(ctx.fresh_name(f"{hint}.fake_quant"), source.dtype, source.shape)
    inputs = [source, scale_value, zero_value]
    graph.append(Node("QuantizeLinear", inputs, [quantized], attributes, domain=domain, name=quantized.name))
    dq_inputs = [quantized, scale_value, zero_value]
    graph.append(Node("DequantizeLinear", dq_inputs, [restored], attributes, domain=domain, name=restored.name))
    return restored
