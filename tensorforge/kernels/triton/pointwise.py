"""Generated Triton kernels for FusedPointwise programs: one pass over memory for a whole elementwise DAG.

`PointwiseKernel(program, num_inputs, outputs, constants)` turns a program (the steps of `ops.fused.parse_program`) into
the source of one Triton kernel per (input dtypes, rank after folding, which outputs are broadcast, 32/64-bit
indexing). The kernel reads every input once, through its strides (stride 0 along a broadcast dim), computes
every step in registers, and stores each requested output cast to its type.

Registers: fp16 / bf16 / fp32 values compute in float32 (rounded once, at the store or at a Cast), float64 in
float64, integers in their own type (wrapping like torch), booleans as int1. Semantics follow the registry's
ops: integer Div truncates toward zero, float division and Sqrt are IEEE-rounded (x/0 = ±inf, 0/0 = NaN),
Min / Max / Clip / Relu propagate NaN as torch does, Cast between floats rounds to nearest even.
Transcendentals (Exp, Log, Erf, Tanh...) use Triton's fast device math, within a few ulp of float32.

Dims that every operand lets merge are folded first (all-contiguous tensors become one flat dim). A program
covers a BLOCK_R × BLOCK_C tile of [rows, last dim], so loads along a unit-stride last dim are contiguous.
An output with fewer elements than the iteration space (a step that saw only broadcast operands) is written
once, at index 0 of each dim it broadcasts along.

Each source is written once to a content-hashed file in the cache directory (Triton's `@jit` needs real
source) and imported; kernels are cached in-process by their source's hash.
"""

from __future__ import annotations

import hashlib
import importlib.util
import math
import os
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import triton

from ...ir import DType
from ...ops.fused import parse_program
from .epilogue import activation_args

_REGISTER_TYPE = {
    torch.float16: "tl.float32",
    torch.bfloat16: "tl.float32",
    torch.float32: "tl.float32",
    torch.float64: "tl.float64",
    torch.bool: "tl.int1",
    torch.int8: "tl.int8",
    torch.int16: "tl.int16",
    torch.int32: "tl.int32",
    torch.int64: "tl.int64",
    torch.uint8: "tl.uint8",
}
_STORAGE_TYPE = {**_REGISTER_TYPE, torch.float16: "tl.float16", torch.bfloat16: "tl.bfloat16"}
_INT32_LIMIT = 2**31
_NAN = "tl.PropagateNan.ALL"
_COMPARISONS = {"Equal": "==", "Greater": ">", "Less": "<", "GreaterOrEqual": ">=", "LessOrEqual": "<="}
_LOGICAL = {"And": "&", "Or": "|", "Xor": "^"}
_BOOLEAN_RESULT = {*_COMPARISONS, *_LOGICAL, "Not", "IsNaN", "IsInf"}
# Activations evaluated by the shared epilogue function, as (ACTIVATION_CODES name, attribute defaults); the
# clamping ones are written below instead, with NaN-propagating min/max as the reference's.
_VIA_ACTIVATE = {
    "Sigmoid": ("Sigmoid", ()),
    "Tanh": ("Tanh", ()),
    "Mish": ("Mish", ()),
}
_FLOAT_UNARY = {
    "Exp": "tl.exp({0})",
    "Log": "tl.log({0})",
    "Erf": "tl.math.erf({0})",
    "Sin": "tl.sin({0})",
    "Cos": "tl.cos({0})",
    "Floor": "tl.floor({0})",
    "Ceil": "tl.ceil({0})",
    "Softsign": "{0} / (1.0 + tl.abs({0}))",
    "Softplus": "tl.maximum({0}, 0.0) + tl.log(1.0 + tl.exp(-tl.abs({0})))",
}


class UnsupportedPointwise(NotImplementedError):
    """A program step (op, type or operand) the generator cannot express; the message names it."""


def pointwise_configs(effort: int) -> list[dict[str, int]]:
    """Elements per program and warps worth timing at `effort`."""
    levels = [[(1024, 4)], [(2048, 8), (512, 4)], [(4096, 8), (256, 2)]]
    chosen = levels[: max(0, min(effort, len(levels) - 1)) + 1]
    return [{"BLOCK": block, "num_warps": warps} for level in chosen for block, warps in level]


@dataclass(frozen=True)
class _Operand:
    name: str  # the register variable
    dtype: torch.dtype  # its element type (as the reference would hold it)

    @property
    def is_float(self) -> bool:
        return self.dtype.is_floating_point

    @property
    def register(self) -> str:
        return _REGISTER_TYPE[self.dtype]


def _result_dtype(op_type: str, args: Sequence[_Operand], attrs: Mapping[str, Any]) -> torch.dtype:
    if op_type in _BOOLEAN_RESULT:
        return torch.bool
    if op_type == "Cast":
        dtype = DType(attrs["to"])
        if not dtype.has_torch or dtype.torch not in _REGISTER_TYPE:
            raise UnsupportedPointwise(f"Cast to {dtype} is not generated")
        return dtype.torch
    if op_type == "Where":
        return args[1].dtype
    return args[0].dtype


def _literal(value: float) -> str:
    if math.isnan(value):
        return 'float("nan")'
    if math.isinf(value):
        return 'float("inf")' if value > 0 else 'float("-inf")'
    return repr(float(value))


class _Emitter:
    """The Triton expression of each step, from its operands' register names and types."""

    def __init__(self, constants: Mapping[int, float]) -> None:
        self.constants = constants

    def emit(self, op_type: str, args: list[_Operand], indices: list[int], attrs: dict[str, Any]) -> str:
        a = args[0].name if args else ""
        first = args[0] if args else None
        if op_type in ("Add", "Sub", "Mul"):
            symbol = {"Add": "+", "Sub": "-", "Mul": "*"}[op_type]
            return f"{a} {symbol} {args[1].name}"
        if op_type in ("Sum", "Mean"):
            total = " + ".join(x.name for x in args)
            if op_type == "Mean":
                self._need_float(op_type, first)
                return f"({total}) / {float(len(args))}"
            return total
        if op_type == "Div":
            return self._divide(a, args[1].name, first)
        if op_type in ("Max", "Min"):
            return self._fold_extreme(op_type, args)
        if op_type in _COMPARISONS:
            return f"{a} {_COMPARISONS[op_type]} {args[1].name}"
        if op_type in _LOGICAL:
            return f"{a} {_LOGICAL[op_type]} {args[1].name}"
        if op_type == "Not":
            return f"{a} == 0"
        if op_type == "Where":
            return f"tl.where({a}, {args[1].name}, {args[2].name})"
        if op_type == "Identity":
            return a
        if op_type == "Cast":
            return self._cast(first, _result_dtype("Cast", args, attrs))
        if op_type == "Neg":
            return f"-{a}"
        if op_type == "Abs":
            return a if first.dtype in (torch.uint8, torch.bool) else f"tl.abs({a})"
        if op_type == "Relu":
            return f"tl.where({a} < 0, 0, {a})"  # NaN stays NaN
        if op_type == "Sign":
            one, zero = ("1.0", "0.0") if first.is_float else ("1", "0")
            return f"tl.where({a} > 0, {one}, tl.where({a} < 0, -{one}, {a} * {zero}))"
        if op_type == "Clip":
            return self._fold_extreme("Max", args[:2]) if len(args) == 2 else self._clip(args)
        if op_type == "IsNaN":
            return f"{a} != {a}"
        if op_type == "IsInf":
            return self._is_inf(a, attrs)
        if op_type == "LeakyRelu":
            return f"tl.where({a} < 0, {a} * {_literal(attrs.get('alpha', 0.01))}, {a})"
        if op_type == "PRelu":
            return f"tl.where({a} < 0, {a} * {args[1].name}, {a})"
        self._need_float(op_type, first)
        return self._float_op(op_type, args, indices, attrs)

    def _float_op(self, op_type: str, args: list[_Operand], indices: list[int], attrs: dict[str, Any]) -> str:
        a = args[0].name
        wide = args[0].dtype == torch.float64
        if op_type in _FLOAT_UNARY:
            return _FLOAT_UNARY[op_type].format(a)
        if op_type == "Sqrt":
            return f"tl.sqrt({a})" if wide else f"tl.sqrt_rn({a})"
        if op_type == "Reciprocal":
            return self._divide("1.0", a, args[0])
        if op_type in _VIA_ACTIVATE:
            name, defaults = _VIA_ACTIVATE[op_type]
            code, p0, p1 = activation_args(name, [attrs.get(key, default) for key, default in defaults])
            return f"activate({a}, {code}, {_literal(p0)}, {_literal(p1)})"
        if op_type in ("HardSigmoid", "HardSwish"):
            hard_sigmoid = op_type == "HardSigmoid"
            alpha, beta = (attrs.get("alpha", 0.2), attrs.get("beta", 0.5)) if hard_sigmoid else (1 / 6, 0.5)
            line = f"{a} * {_literal(alpha)} + {_literal(beta)}"
            clamped = f"tl.minimum(tl.maximum({line}, 0.0, propagate_nan={_NAN}), 1.0, propagate_nan={_NAN})"
            return clamped if op_type == "HardSigmoid" else f"{a} * {clamped}"
        if op_type == "Elu":
            return f"tl.where({a} < 0, {_literal(attrs.get('alpha', 1.0))} * (tl.exp({a}) - 1.0), {a})"
        if op_type == "Selu":
            alpha = _literal(attrs.get("alpha", 1.67326319217681884765625))
            gamma = _literal(attrs.get("gamma", 1.05070102214813232421875))
            return f"{gamma} * tl.where({a} > 0, {a}, {alpha} * (tl.exp({a}) - 1.0))"
        if op_type == "Celu":
            alpha = _literal(attrs.get("alpha", 1.0))
            negative = f"tl.minimum({alpha} * (tl.exp({a} / {alpha}) - 1.0), 0.0, propagate_nan={_NAN})"
            return f"tl.maximum({a}, 0.0, propagate_nan={_NAN}) + {negative}"
        if op_type == "ThresholdedRelu":
            return f"tl.where({a} > {_literal(attrs.get('alpha', 1.0))}, {a}, 0.0)"
        if op_type == "Shrink":
            lambd, bias = _literal(attrs.get("lambd", 0.5)), _literal(attrs.get("bias", 0.0))
            return f"tl.where({a} < -{lambd}, {a} + {bias}, tl.where({a} > {lambd}, {a} - {bias}, 0.0))"
        if op_type == "Pow":
            return self._pow(a, indices[1])
        raise UnsupportedPointwise(f"{op_type} has no generated Triton form")

    @staticmethod
    def _need_float(op_type: str, operand: _Operand | None) -> None:
        if operand is None or not operand.is_float:
            kind = operand.dtype if operand is not None else "no operand"
            raise UnsupportedPointwise(f"{op_type} on {kind} is generated for float operands only")

    @staticmethod
    def _divide(a: str, b: str, operand: _Operand) -> str:
        if not operand.is_float:
            return f"{a} // {b}"  # Triton's integer division truncates toward zero, as the reference's Div
        return f"({a} / {b})" if operand.dtype == torch.float64 else f"tl.math.div_rn({a}, {b})"

    @staticmethod
    def _fold_extreme(op_type: str, args: Sequence[_Operand]) -> str:
        fn = "tl.maximum" if op_type == "Max" else "tl.minimum"
        extra = f", propagate_nan={_NAN}" if args[0].is_float else ""
        expression = args[0].name
        for operand in args[1:]:
            expression = f"{fn}({expression}, {operand.name}{extra})"
        return expression

    def _clip(self, args: Sequence[_Operand]) -> str:
        low = self._fold_extreme("Max", args[:2])
        extra = f", propagate_nan={_NAN}" if args[0].is_float else ""
        return f"tl.minimum({low}, {args[2].name}{extra})"

    @staticmethod
    def _is_inf(a: str, attrs: Mapping[str, Any]) -> str:
        terms = []
        if attrs.get("detect_positive", 1):
            terms.append(f'({a} == float("inf"))')
        if attrs.get("detect_negative", 1):
            terms.append(f'({a} == float("-inf"))')
        return " | ".join(terms) if terms else f"({a} != {a}) & ({a} == {a})"  # never true

    @staticmethod
    def _cast(source: _Operand, target: torch.dtype) -> str:
        a = source.name
        if target == torch.bool:
            return f"{a} != 0"
        storage = _STORAGE_TYPE[target]
        register = _REGISTER_TYPE[target]
        if storage != register:  # round to fp16 / bf16, then compute on in float32
            return f"{a}.to({storage}).to({register})"
        return f"{a}.to({register})"

    def _pow(self, a: str, exponent_index: int) -> str:
        """x ** p for a constant exponent p: small integer powers as products, 0.5 as Sqrt, others through
        exp2(p · log2|x|) with the sign of an odd integer power (NaN for a negative base otherwise)."""
        if exponent_index not in self.constants:
            raise UnsupportedPointwise("Pow is generated only with a constant scalar exponent")
        p = float(self.constants[exponent_index])
        if p == 0.5:
            return f"tl.sqrt_rn({a})"
        if p.is_integer() and 0 <= p <= 4:
            return " * ".join([a] * int(p)) if p else f"({a} * 0.0 + 1.0)"
        if p.is_integer() and -4 <= p < 0:
            return self._divide("1.0", "(" + " * ".join([a] * int(-p)) + ")", _Operand(a, torch.float32))
        magnitude = f"tl.exp2({_literal(p)} * tl.log2(tl.abs({a})))"
        if p.is_integer():
            return magnitude if int(p) % 2 == 0 else f"tl.where({a} < 0, -{magnitude}, {magnitude})"
        return f'tl.where({a} < 0, float("nan"), {magnitude})'


def _check_op(op_type: str) -> None:
    if op_type not in _SUPPORTED:
        raise UnsupportedPointwise(f"{op_type} has no generated Triton form; supported: {sorted(_SUPPORTED)}")


_SUPPORTED = frozenset(
    {
        "Add", "Sub", "Mul", "Div", "Sum", "Mean", "Max", "Min", "Neg", "Abs", "Relu", "Sign", "Clip", "IsNaN",
        "IsInf", "LeakyRelu", "PRelu", "Where", "Identity", "Cast", "Not", "Sqrt", "Reciprocal", "Selu", "Celu",
        "ThresholdedRelu", "Shrink", "Pow", "HardSigmoid", "HardSwish", "Elu",
        *_COMPARISONS, *_LOGICAL, *_VIA_ACTIVATE, *_FLOAT_UNARY,
    }
)  # fmt: skip

Step = tuple[str, list[int], dict[str, Any]]


def operand_dtypes(steps: Sequence[Step], input_dtypes: Sequence[torch.dtype]) -> list[torch.dtype]:
    """The element type of every operand: the inputs', then each step's result (ONNX's type rules)."""
    dtypes = list(input_dtypes)
    for op_type, indices, attrs in steps:
        dtypes.append(_result_dtype(op_type, [_Operand("", dtypes[i]) for i in indices], attrs))
    return dtypes


def generate_source(
    steps: Sequence[Step],
    outputs: Sequence[int],
    input_dtypes: Sequence[torch.dtype],
    rank: int,
    output_broadcast: Sequence[Sequence[bool]],
    constants: Mapping[int, float] = {},
    wide: bool = False,
) -> str:
    """The source of the Triton kernel `kernel` for a program over a folded iteration space of `rank` dims.

    Arguments: the input pointers x0.., the output pointers y0.., ROWS and COLS (the iteration space as
    [prod(dims[:-1]), dims[-1]]), the dims d0..d{rank-2}, then each input's and each output's `rank` strides,
    then BLOCK_R, BLOCK_C. `output_broadcast[k][d]` says output k is broadcast along folded dim d (written at
    index 0 only). Raises `UnsupportedPointwise` for a step it cannot express.
    """
    for op_type, _, _ in steps:
        _check_op(op_type)
    unknown = sorted({str(d) for d in input_dtypes if d not in _REGISTER_TYPE})
    if unknown:
        raise UnsupportedPointwise(f"inputs of type {', '.join(unknown)} are not generated")
    n = len(input_dtypes)
    dtypes = operand_dtypes(steps, input_dtypes)
    read = sorted({i for _, indices, _ in steps for i in indices if i < n} | {i for i in outputs if i < n})
    dims = [f"d{d}" for d in range(rank - 1)]
    params = [f"x{i}" for i in range(n)] + [f"y{k}" for k in range(len(outputs))] + ["ROWS", "COLS", *dims]
    params += [f"sx{i}_{d}" for i in range(n) for d in range(rank)]
    params += [f"sy{k}_{d}" for k in range(len(outputs)) for d in range(rank)]
    lines = [
        "import triton",
        "import triton.language as tl",
        "",
        "from tensorforge.kernels.triton.epilogue import activate",
        "",
        "",
        "@triton.jit",
        f"def kernel({', '.join(params)}, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):",
        "    pid = tl.program_id(0)",
        "    col_tiles = tl.cdiv(COLS, BLOCK_C)",
        "    r = (pid // col_tiles) * BLOCK_R + tl.arange(0, BLOCK_R)",
        "    c = (pid % col_tiles) * BLOCK_C + tl.arange(0, BLOCK_C)",
    ]
    if wide:
        lines += ["    r = r.to(tl.int64)", "    c = c.to(tl.int64)"]
    lines.append("    inside = (r < ROWS)[:, None] & (c < COLS)[None, :]")
    # The row index split into the folded dims, the last one fastest.
    if rank > 1:
        rest = "r"
        for d in range(rank - 2, 0, -1):
            lines += [f"    i{d} = {rest} % d{d}", f"    rest{d} = {rest} // d{d}"]
            rest = f"rest{d}"
        lines.append(f"    i0 = {rest}")

    def offset(prefix: str) -> str:
        rows = " + ".join(f"i{d} * {prefix}_{d}" for d in range(rank - 1))
        cols = f"c[None, :] * {prefix}_{rank - 1}"
        return f"({rows})[:, None] + {cols}" if rows else cols

    for i in read:
        lines.append(
            f"    v{i} = tl.load(x{i} + {offset(f'sx{i}')}, mask=inside, other=1).to({_REGISTER_TYPE[dtypes[i]]})"
        )
    emitter = _Emitter(constants)
    for position, (op_type, indices, attrs) in enumerate(steps):
        args = [_Operand(f"v{i}", dtypes[i]) for i in indices]
        target = n + position
        expression = emitter.emit(op_type, args, indices, attrs)
        lines.append(f"    v{target} = ({expression}).to({_REGISTER_TYPE[dtypes[target]]})")
    for k, operand in enumerate(outputs):
        mask = "inside"
        for d, broadcast in enumerate(output_broadcast[k]):
            if broadcast:
                mask += " & (c == 0)[None, :]" if d == rank - 1 else f" & (i{d} == 0)[:, None]"
        lines.append(f"    tl.store(y{k} + {offset(f'sy{k}')}, v{operand}.to(y{k}.dtype.element_ty), mask={mask})")
    return "\n".join(lines) + "\n"


def _cache_dir() -> Path:
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "tensorforge" / "pointwise"
    try:
        base.mkdir(parents=True, exist_ok=True)
        return base
    except OSError:
        fallback = Path(tempfile.gettempdir()) / "tensorforge-pointwise"
        fallback.mkdir(parents=True, exist_ok=True)
        return fallback


_LOADED: dict[str, Callable] = {}


def load_kernel(source: str) -> Callable:
    """The `kernel` of `source`, written once to a content-hashed file and imported (cached in-process)."""
    digest = hashlib.sha256(source.encode()).hexdigest()[:24]
    kernel = _LOADED.get(digest)
    if kernel is not None:
        return kernel
    path = _cache_dir() / f"pointwise_{digest}.py"
    if not path.exists() or path.read_text() != source:
        partial = path.with_suffix(f".{os.getpid()}.tmp")
        partial.write_text(source)
        os.replace(partial, path)  # atomic: concurrent builds never import a half-written file
    spec = importlib.util.spec_from_file_location(f"tensorforge_pointwise_{digest}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    _LOADED[digest] = module.kernel
    return module.kernel


# -- launching ---------------------------------------------------------------------------------------------


def _strides_over(shape: Sequence[int], t: torch.Tensor) -> list[int]:
    """`t`'s strides over the broadcast `shape` (right-aligned; 0 along dims where `t` has size 1 or none)."""
    pad = len(shape) - t.dim()
    return [0 if d < pad or t.shape[d - pad] == 1 else t.stride(d - pad) for d in range(len(shape))]


def fold_dims(sizes: Sequence[int], strides: Sequence[Sequence[int]]) -> tuple[list[int], list[list[int]]]:
    """Drop size-1 dims and merge dim i into dim i+1 wherever, for every operand, stride[i] == stride[i+1] ·
    size[i+1]: the same elements at the same addresses in fewer dims (at least one)."""
    keep = [d for d, size in enumerate(sizes) if size != 1] or [len(sizes) - 1] if sizes else []
    if not keep:
        return [1], [[0] for _ in strides]
    out_sizes = [sizes[keep[0]]]
    out_strides = [[s[keep[0]]] for s in strides]
    for d in keep[1:]:
        if all(out[-1] == s[d] * sizes[d] for out, s in zip(out_strides, strides, strict=True)):
            out_sizes[-1] *= sizes[d]
            for out, s in zip(out_strides, strides, strict=True):
                out[-1] = s[d]
        else:
            out_sizes.append(sizes[d])
            for out, s in zip(out_strides, strides, strict=True):
                out.append(s[d])
    return out_sizes, out_strides


def _step_shapes(steps: Sequence[Step], shapes: Sequence[tuple[int, ...]]) -> list[tuple[int, ...]]:
    result = list(shapes)
    for _, indices, _ in steps:
        result.append(tuple(torch.broadcast_shapes(*[result[i] for i in indices])))
    return result


class PointwiseKernel:
    """A FusedPointwise program run as generated Triton kernels.

    `program` is the node's `program` attribute, `num_inputs` its input count, `outputs` its `outputs`
    attribute (operand indices; the last step when None), `constants` scalar values of inputs known when the
    layer is built (a Pow exponent must be one). Raises `UnsupportedPointwise` naming a step it cannot
    generate.
    """

    def __init__(
        self,
        program: str,
        num_inputs: int,
        outputs: Sequence[int] | None = None,
        constants: Mapping[int, float] | None = None,
    ) -> None:
        self.steps = parse_program(program)
        if not self.steps:
            raise ValueError("a FusedPointwise program needs at least one step")
        self.num_inputs = num_inputs
        self.outputs = list(outputs) if outputs else [num_inputs + len(self.steps) - 1]
        self.constants = dict(constants or {})
        for op_type, _, _ in self.steps:
            _check_op(op_type)
        self._launches: dict[tuple, tuple] = {}

    def check(self, input_dtypes: Sequence[torch.dtype]) -> None:
        """Raise `UnsupportedPointwise` if the program cannot be generated for inputs of these types."""
        generate_source(self.steps, self.outputs, input_dtypes, 1, [[False]] * len(self.outputs), self.constants)

    def __call__(
        self,
        *inputs: torch.Tensor,
        out: Sequence[torch.Tensor] | None = None,
        config: Mapping[str, int] | None = None,
    ) -> tuple[torch.Tensor, ...]:
        """The requested outputs, in fresh contiguous tensors or in the `out` tensors given."""
        if len(inputs) != self.num_inputs:
            raise ValueError(f"this FusedPointwise program reads {self.num_inputs} inputs, got {len(inputs)}")
        config = dict(config or pointwise_configs(0)[0])
        shapes = [tuple(t.shape) for t in inputs]
        dtypes = [t.dtype for t in inputs]
        step_shapes = _step_shapes(self.steps, shapes)
        all_dtypes = operand_dtypes(self.steps, dtypes)
        wanted = [(step_shapes[i], all_dtypes[i]) for i in self.outputs]
        results = _outputs(out, wanted, inputs[0].device)
        full = tuple(torch.broadcast_shapes(*shapes))
        if math.prod(full) == 0:
            return tuple(results)
        key = (
            tuple((t.shape, t.stride(), t.dtype) for t in inputs),
            tuple((t.stride(), t.dtype) for t in results),
            config["BLOCK"],
        )
        launch = self._launches.get(key)
        if launch is None:
            launch = self._plan(full, inputs, results, dtypes, config["BLOCK"])
            if len(self._launches) < 256:
                self._launches[key] = launch
        kernel, grid, scalars, block_r, block_c = launch
        kernel[grid](*inputs, *results, *scalars, BLOCK_R=block_r, BLOCK_C=block_c, num_warps=config["num_warps"])
        return tuple(results)

    def _plan(self, full, inputs, results, dtypes, block) -> tuple:
        strides = [_strides_over(full, t) for t in (*inputs, *results)]
        sizes, folded = fold_dims(full, strides)
        outputs = folded[len(inputs) :]
        broadcast = [[st == 0 and size > 1 for st, size in zip(s, sizes, strict=True)] for s in outputs]
        reach = max(sum((size - 1) * abs(st) for size, st in zip(sizes, s, strict=True)) for s in folded)
        wide = max(reach + 1, math.prod(sizes)) >= _INT32_LIMIT
        source = generate_source(self.steps, self.outputs, dtypes, len(sizes), broadcast, self.constants, wide)
        kernel = load_kernel(source)
        cols, rows = sizes[-1], math.prod(sizes[:-1])
        block_c = min(triton.next_power_of_2(cols), block)
        block_r = max(1, min(block // block_c, triton.next_power_of_2(rows)))  # rank 1: one row
        grid = (triton.cdiv(rows, block_r) * triton.cdiv(cols, block_c),)
        scalars = [rows, cols, *sizes[:-1], *(st for s in folded for st in s)]
        return kernel, grid, scalars, block_r, block_c


def _outputs(
    out: Sequence[torch.Tensor] | None, wanted: Sequence[tuple[tuple[int, ...], torch.dtype]], device: torch.device
) -> list[torch.Tensor]:
    """Fresh contiguous outputs, or the caller's `out` tensors once checked (any dtype we can store)."""
    if out is None:
        return [torch.empty(shape, dtype=dtype, device=device) for shape, dtype in wanted]
    if len(out) != len(wanted):
        raise ValueError(f"FusedPointwise: {len(out)} out tensors for {len(wanted)} outputs")
    for k, (t, (shape, _)) in enumerate(zip(out, wanted, strict=True)):
        if tuple(t.shape) != shape or t.device != device or t.dtype not in _REGISTER_TYPE:
            raise ValueError(
                f"FusedPointwise: out[{k}] is {t.dtype} {list(t.shape)} on {t.device}, needs {list(shape)} on {device}"
            )
        if any(stride == 0 and size > 1 for stride, size in zip(t.stride(), t.shape, strict=True)):
            raise ValueError(f"FusedPointwise: out[{k}] overlaps itself (a zero stride); pass a dense tensor")
    return list(out)
