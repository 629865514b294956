"""Precision and layout variants of a layer, and the wrapper that runs a tactic's kernel in one.

A variant is the `precision` and `layout` entries of a tactic config. Precision: a layer in fp16 or bf16
reads every input the graph declares float32 in that type and writes its float32 outputs in it; tf32 keeps
float32 storage and lets cuDNN and cuBLAS use TF32 math; fp32 is full float32 math. Layout: "any" takes 4-D
tensors in whatever memory format they come, "NCHW" and "NHWC" (torch's channels_last) make them so first.
A reformat (a cast or a memory-format copy) costs time inside the layer that needs it, so when the autotuner
times a layer on its producers' real outputs, the reformat is part of the measured cost.

Constant inputs (weights) are converted once, when the layer is prepared, never per call.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ..ir import DType, Node, Value, qualified_op
from ..kernels.triton.copy import relayout, tiled
from ..ops.fused import DOMAIN
from ..ops.math_flags import tf32_math
from ..ops.registry import HOST_INPUTS
from .base import Alloc, Kernel, Tactic

ConstantCache = dict[tuple[str, ...], torch.Tensor]  # converted weights by (name, dtype, layout, device type)
PRECISION_DTYPE = {"fp32": torch.float32, "tf32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
LAYOUTS = ("any", "NCHW", "NHWC")
# Ops whose math TF32 changes (cuDNN convolutions, cuBLAS products); elsewhere tf32 is fp32.
TF32_OPS = frozenset(
    {"Conv", "ConvTranspose", "Gemm", "MatMul", "Einsum", f"{DOMAIN}::FusedConv", f"{DOMAIN}::FusedGemm"}
)

# Float32 operands a variant leaves in float32 (quantization scales), by op and input index.
FLOAT32_OPERANDS = {f"{DOMAIN}::QuantizedConv": frozenset({4, 5}), f"{DOMAIN}::QuantizedGemm": frozenset({4})}


@dataclass(frozen=True)
class Variant:
    precision: str = "fp32"
    layout: str = "any"

    @classmethod
    def of(cls, config: Mapping[str, Any]) -> Variant:
        return cls(config.get("precision", "fp32"), config.get("layout", "any"))

    @property
    def dtype(self) -> torch.dtype:
        return PRECISION_DTYPE[self.precision]

    @property
    def memory_format(self) -> torch.memory_format | None:
        return {"NCHW": torch.contiguous_format, "NHWC": torch.channels_last}.get(self.layout)


def float_type(config: Mapping[str, Any]) -> torch.dtype:
    """The type of a float value (an output, a float input) in the variant of tactic config `config`."""
    return PRECISION_DTYPE[config.get("precision", "fp32")]


def has_float_activation(node: Node, constants: bool = False) -> bool:
    """Whether `node` reads or writes a float32 activation (a value that is not a constant; any float32 value with
    `constants`)."""
    values = (*node.inputs, *node.outputs)
    return any(v is not None and (constants or not v.is_const) and v.dtype == DType.FLOAT for v in values)


def layout_free(node: Node) -> bool:
    """Whether NCHW and NHWC are the same memory for every activation `node` reads or writes: each 4-D one has a
    1×1 spatial map (a classifier's convolutions after a global pool), so no layout change is ever needed."""
    for value in (*node.inputs, *node.outputs):
        if value is None or value.is_const or value.rank != 4:
            continue
        if value.shape is None or tuple(value.shape[2:]) != (1, 1):
            return False
    return True


def precision_choices(node: Node, allowed: Sequence[str], computes_in_it: bool = False) -> list[str]:
    """The precisions worth trying for `node`: only fp32 unless it reads or writes a float32 tensor. Float
    constants count only for a tactic that computes in the variant's type (`computes_in_it`, the float fallback
    of a quantized layer): a quantized kernel between quantized activations (int8 in, int8 out, a float32 bias
    and scales) is the same kernel in every precision, which would only be timed again and again."""
    if not has_float_activation(node, constants=computes_in_it):
        return ["fp32"]
    choices = [p for p in PRECISION_DTYPE if p in allowed]
    if qualified_op(node) not in TF32_OPS:
        choices = [p for p in choices if p != "tf32"]
    return choices or ["fp32"]


def variants(tactic: Tactic, node: Node, allowed: Sequence[str], device: torch.device) -> list[Variant]:
    """Every (precision, layout) of `tactic` for `node`: its precisions the build allows, its layouts. Where no
    float value reaches the layer (int8 in, int8 out) one variant is enough: fp32, or for a tactic without it its
    first precision the build allows (the Gluon and Triton int8 products, whose float32 tiles would not fit)."""
    choices = precision_choices(node, allowed, tactic.precision_from_constants)
    precisions = [p for p in choices if p in tactic.precisions]
    if not precisions and not has_float_activation(node, constants=tactic.precision_from_constants):
        precisions = [p for p in tactic.precisions if p in allowed][:1]
    first = node.inputs[0] if node.inputs else None
    layouts = tactic.layouts if first is not None and first.rank == 4 else tactic.layouts[:1]
    return [Variant(p, layout) for p in precisions for layout in layouts]


def convert(tensor: Any, declared: DType, variant: Variant) -> Any:
    """`tensor` in the variant's precision (when the graph declares it float32) and memory format (4-D)."""
    if not isinstance(tensor, torch.Tensor):
        return tensor
    cast = declared == DType.FLOAT and tensor.is_floating_point() and tensor.dtype != variant.dtype
    memory_format = variant.memory_format
    relaid = memory_format is not None and tensor.dim() == 4 and not tensor.is_contiguous(memory_format=memory_format)
    return _reformat(tensor, variant.dtype if cast else None, memory_format if relaid else None)


def _reformat(tensor: torch.Tensor, dtype: torch.dtype | None, memory_format: torch.memory_format | None):
    """`tensor` cast to `dtype` and laid out in `memory_format` (either None: unchanged), in one copy when both.
    A layout change on CUDA is our tiled copy (`relayout`): torch moves a transposed tensor element by element."""
    if memory_format is not None and tiled(tensor, dtype or tensor.dtype):
        return relayout(tensor, dtype or tensor.dtype, memory_format)
    if dtype is not None and memory_format is not None:
        return tensor.to(dtype, memory_format=memory_format)
    if dtype is not None:
        return tensor.to(dtype)
    if memory_format is not None:
        return tensor.contiguous(memory_format=memory_format)
    return tensor


def output_dtypes(node: Node, variant: Variant) -> tuple[torch.dtype | None, ...]:
    """What each output of `node` must be in `variant`: float32 outputs in its precision, others unchanged."""
    return tuple(
        variant.dtype if v.dtype == DType.FLOAT else (v.dtype.torch if v.dtype.has_torch else None)
        for v in node.outputs
    )


def constant_inputs(node: Node) -> dict[int, Value]:
    return {i: v for i, v in enumerate(node.inputs) if v is not None and v.is_const}


class LayerKernel:
    """A tactic's kernel run in a variant: constants bound and pre-converted, activations converted per call,
    outputs in the dtypes the variant promises. Called with the layer's non-constant inputs in order. With
    `converts_on_load` the kernel reads the activations as they come (the tactic's kernels convert as they load);
    with `strided_inputs` a channel slice of a channels_last tensor is passed to an NHWC kernel as it is.

    A call is on the execution loop's path once per layer and run, so what does not change between calls is
    worked out here: the input list with the constants in place (copied, then filled with the converted
    arguments), which arguments the graph declares float32, the variant's dtype and memory format, and
    whether any output can need a cast at all.
    """

    __slots__ = (
        "_arg_float",
        "_arg_positions",
        "_cast_outputs",
        "_convert_args",
        "_declared",
        "_dtype",
        "_memory_format",
        "_slots",
        "_strided",
        "_template",
        "constants",
        "kernel",
        "node",
        "out_dtypes",
        "variant",
        "writes_into",
    )

    def __init__(
        self,
        node: Node,
        kernel: Kernel,
        variant: Variant,
        constants: Mapping[int, torch.Tensor],
        writes_into: bool = False,
        converts_on_load: bool = False,
        strided_inputs: bool = False,
    ) -> None:
        self.node = node
        self.kernel = kernel
        self.writes_into = writes_into
        self.variant = variant
        self.constants = dict(constants)
        self.out_dtypes = output_dtypes(node, variant)
        self._declared = [v.dtype if v is not None else DType.UNDEFINED for v in node.inputs]
        # For each input position: ("const", tensor), ("arg", k) for the k-th call argument, or ("none", None).
        slots: list[tuple[str, Any]] = []
        count = 0
        for index, value in enumerate(node.inputs):
            if value is None:
                slots.append(("none", None))
            elif index in self.constants:
                slots.append(("const", self.constants[index]))
            else:
                slots.append(("arg", count))
                count += 1
        self._slots = slots
        self._template = [payload if kind == "const" else None for kind, payload in slots]
        self._arg_positions = tuple(index for index, (kind, _) in enumerate(slots) if kind == "arg")
        self._arg_float = tuple(self._declared[index] == DType.FLOAT for index in self._arg_positions)
        self._dtype = variant.dtype
        self._memory_format = variant.memory_format
        self._cast_outputs = any(dtype is not None for dtype in self.out_dtypes)
        self._convert_args = not converts_on_load
        self._strided = strided_inputs and variant.memory_format == torch.channels_last

    def __call__(self, args: Sequence[Any], alloc: Alloc | None = None) -> tuple[Any, ...]:
        """The outputs for `args`; a `writes_into` kernel asks `alloc` (when given) for its output buffers."""
        inputs = self._template.copy()
        dtype, memory_format = self._dtype, self._memory_format
        for position, declared_float, tensor in zip(self._arg_positions, self._arg_float, args, strict=True):
            if self._convert_args and isinstance(tensor, torch.Tensor):  # `convert`, inlined
                cast = declared_float and tensor.dtype != dtype and tensor.is_floating_point()
                relaid = (
                    memory_format is not None
                    and tensor.dim() == 4
                    and not tensor.is_contiguous(memory_format=memory_format)
                    # a channel slice a strided kernel reads as it is, unless it is copied for a cast anyway
                    and (cast or not (self._strided and tensor.stride(1) == 1))
                )
                if cast or relaid:
                    tensor = _reformat(tensor, dtype if cast else None, memory_format if relaid else None)
            inputs[position] = tensor
        if self.variant.precision == "tf32":
            with tf32_math():
                outputs = self._run(inputs, alloc)
        else:
            outputs = self._run(inputs, alloc)
        if not self._cast_outputs:
            return tuple(outputs)
        return tuple(
            out.to(dtype) if dtype is not None and isinstance(out, torch.Tensor) and out.dtype != dtype else out
            for out, dtype in zip(outputs, self.out_dtypes, strict=False)
        )

    def _run(self, inputs: list[Any], alloc: Alloc | None) -> Sequence[Any]:
        if alloc is not None and self.writes_into:
            return self.kernel(inputs, alloc=alloc)
        return self.kernel(inputs)


def prepare_constants(
    node: Node, variant: Variant, device: torch.device, cache: ConstantCache
) -> dict[int, torch.Tensor]:
    """`node`'s constant inputs on `device` in `variant`, converted once and shared through `cache`; integer
    operands the implementation reads as numbers (`HOST_INPUTS`) stay on the host."""
    prepared = {}
    host = HOST_INPUTS.get(node.op_type, ()) if node.domain in ("", "ai.onnx") else ()
    float32 = FLOAT32_OPERANDS.get(qualified_op(node), frozenset())
    for index, value in constant_inputs(node).items():
        on_host = index in host and isinstance(value.const, torch.Tensor)
        target = torch.device("cpu") if on_host else device
        declared = DType.UNDEFINED if index in float32 else value.dtype
        key = (value.name, str(variant.dtype) if declared == DType.FLOAT else "", variant.layout, target.type)
        tensor = cache.get(key)
        if tensor is None:
            const = value.const
            tensor = convert(const.to(target) if isinstance(const, torch.Tensor) else const, declared, variant)
            cache[key] = tensor
        prepared[index] = tensor
    return prepared
