"""Pointwise fusion: maximal groups of elementwise ONNX ops become one `tensorforge::FusedPointwise` node.

A group is a connected set of elementwise nodes (a chain or a small DAG). The fused node computes, step by
step, exactly what the nodes computed (each step runs the op's registry implementation, see
`ops/fused.py`): its inputs are the values the group reads from outside (graph inputs, initializers, other
nodes' outputs), and its outputs are every member result read outside the group or by the graph's caller.

Groups grow along producer → consumer edges, visiting nodes in topological order. An edge is not fused when

- it changes the element type and the consumer is not a `Cast` (comparisons, which turn any type into a
  boolean mask, and boolean masks themselves count as changing nothing: `Where(x > 0, x, y)` fuses), or
- merging would create a cycle: a node outside both groups depends on one of them and feeds the other, so
  the fused node would need its own output as an input.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

import torch

from ..ir import DType, Graph, Node, Value
from ..ir.validate import topological_order
from ..ops.fused import DOMAIN, pointwise_program
from ..ops.registry import REGISTRY
from .base import Pass, PassContext
from .utils import add_initializer, is_graph_output, replace_node

# Elementwise ops of the ONNX domain: each output element depends only on the input elements at the same
# (broadcast) position. Declared once; other passes may import these sets.
BOOLEAN_RESULT_OPS = frozenset(
    {"Equal", "Greater", "Less", "GreaterOrEqual", "LessOrEqual", "Not", "And", "Or", "Xor", "IsNaN", "IsInf"}
)
ELEMENTWISE_OPS = BOOLEAN_RESULT_OPS | frozenset(
    {
        "Add", "Sub", "Mul", "Div", "Pow", "Mod", "Neg", "Abs", "Sign", "Exp", "Log", "Sqrt", "Reciprocal",
        "Floor", "Ceil", "Round", "Erf", "Sin", "Cos", "Tan", "Asin", "Acos", "Atan", "Sinh", "Cosh",
        "Asinh", "Acosh", "Atanh", "Relu", "LeakyRelu", "PRelu", "Elu", "Selu", "Celu", "ThresholdedRelu",
        "Sigmoid", "HardSigmoid", "HardSwish", "Tanh", "Softplus", "Softsign", "Mish", "Shrink", "Clip",
        "Where", "Min", "Max", "Sum", "Mean", "Cast", "Identity",
    }
)  # fmt: skip

# Element types a fused program may carry (the rest have no plain torch arithmetic).
_PLAIN_DTYPES = frozenset(
    {
        DType.FLOAT, DType.FLOAT16, DType.BFLOAT16, DType.DOUBLE, DType.BOOL,
        DType.INT8, DType.INT16, DType.INT32, DType.INT64, DType.UINT8,
    }
)  # fmt: skip

_PROGRAM_OPSET = 22  # FusedPointwise evaluates its steps with the opset-22 definitions

RULE = "fuse-pointwise"


@dataclass
class _Step:
    """One member node as a program step.

    Operands are indices into the node's inputs (read when fusing: an earlier fusion may have rewired them)
    or constant tensors still to be added as initializers.
    """

    node: Node
    operands: list[int | torch.Tensor]
    attrs: dict[str, Any]


@dataclass
class _Unit:
    """A node of the graph being contracted: one node, or a group of fused-to-be members."""

    members: list[Node] = field(default_factory=list)


class FusePointwise(Pass):
    """Fuse groups of ≥2 elementwise ops into `FusedPointwise(inputs...) = program(inputs...)`.

    The program replays the members in topological order: step i applies member i's op to the fused node's
    inputs and earlier steps' results, so every exported value equals the value it replaces bit for bit.
    """

    name = "fuse-pointwise"

    def run(self, ctx: PassContext) -> bool:
        graph = ctx.model.graph
        order = topological_order(graph)
        steps = self._steps(order, ctx)
        units = _Contraction(graph, order)
        for node in order:
            if node not in steps:
                continue
            for value in dict.fromkeys(v for v in node.inputs if v is not None):
                producer = value.producer()
                if producer not in steps or units.unit(producer) is units.unit(node):
                    continue
                reason = _edge_problem(value, node)
                if reason is None:
                    through = units.path_around(units.unit(producer), units.unit(node))
                    if through is not None:
                        reason = f"fusing {value.name!r} into its consumer would create a cycle through {through.label}"
                if reason is not None:
                    ctx.declined(RULE, node, reason)
                    continue
                units.merge(units.unit(producer), units.unit(node))
        changed = False
        for unit in units.groups():
            if len(unit.members) >= 2:
                members = sorted(unit.members, key=units.index.__getitem__)
                with ctx.rewriting():
                    detail = _fuse(graph, members, steps, ctx)
                if detail:
                    ctx.fired(RULE, members[-1], detail)
                    changed = True
        return changed

    def _steps(self, order: list[Node], ctx: PassContext) -> dict[Node, _Step]:
        steps = {}
        for node in order:
            if node.domain not in ("", "ai.onnx") or node.op_type not in ELEMENTWISE_OPS:
                continue
            step = _as_step(node, ctx.opset())
            if isinstance(step, str):
                ctx.declined(RULE, node, step)
            else:
                steps[node] = step
        return steps


def _as_step(node: Node, opset: int) -> _Step | str:
    """`node` as a program step, or why it cannot be one."""
    if len(node.outputs) != 1 or any(True for _ in node.subgraphs()):
        return "not a single-output node"
    values = [v for v in node.inputs if v is not None] + list(node.outputs)
    odd = sorted({str(v.dtype) for v in values if v.dtype not in _PLAIN_DTYPES})
    if odd:
        return f"element type {', '.join(odd)} is not fused"
    if not all(_json_scalar(a) for a in node.attributes.values()):
        return "an attribute is not a number or string"
    here, there = REGISTRY.lookup(node.op_type, "", opset), REGISTRY.lookup(node.op_type, "", _PROGRAM_OPSET)
    if here is None or there is None:
        return f"{node.op_type} has no opset-{_PROGRAM_OPSET} definition to run in a fused program"
    if node.op_type == "Clip":
        return _clip_step(node, opset)
    if node.op_type == "Cast":
        if opset < 6 or node.attributes.get("round_mode", "up") != "up":
            return "this Cast has no opset-19 equivalent"
        attrs = {"to": node.attributes["to"], "saturate": node.attributes.get("saturate", 1)}
        return _Step(node, [0], attrs)
    if here is not there:
        return f"{node.op_type} at opset {opset} differs from opset {_PROGRAM_OPSET}"
    if any(v is None for v in node.inputs):
        return "an optional input is missing"
    return _Step(node, list(range(len(node.inputs))), dict(node.attributes))


def _clip_step(node: Node, opset: int) -> _Step | str:
    """Clip with constant bounds, as the opset-11 form `Clip(x, min, max)` (missing bounds are unbounded)."""
    x = node.inputs[0]
    dtype = x.dtype.torch
    if opset < 11:
        low = node.attributes.get("min", -math.inf)
        high = node.attributes.get("max", math.inf)
        return _Step(node, [0, torch.tensor(low, dtype=dtype), torch.tensor(high, dtype=dtype)], {})
    bounds = list(node.inputs[1:]) + [None] * (3 - len(node.inputs))
    if any(b is not None and not b.is_const for b in bounds):
        return "Clip bounds are not constant"
    if bounds[1] is None:
        return _Step(node, [0] if bounds[0] is None else [0, 1], {})
    lowest = -math.inf if x.dtype.is_float else torch.iinfo(dtype).min
    return _Step(node, [0, 1 if bounds[0] is not None else torch.tensor(lowest, dtype=dtype), 2], {})


def _json_scalar(value: Any) -> bool:
    if isinstance(value, list | tuple):
        return all(_json_scalar(v) for v in value)
    return isinstance(value, bool | int | float | str) and not (isinstance(value, float) and not math.isfinite(value))


def _edge_problem(value: Value, consumer: Node) -> str | None:
    """Why `value` must not be fused into `consumer`: it would change element type inside the group."""
    result = consumer.outputs[0].dtype
    if value.dtype == result or value.dtype == DType.BOOL:
        return None
    if consumer.op_type == "Cast" or consumer.op_type in BOOLEAN_RESULT_OPS:
        return None
    return f"{value.name!r} is {value.dtype} but {consumer.op_type} computes {result}, and it is not a Cast"


class _Contraction:
    """The graph with each group contracted to one unit, kept acyclic as groups merge."""

    def __init__(self, graph: Graph, order: list[Node]) -> None:
        self.index = {node: i for i, node in enumerate(order)}
        self._unit = {node: _Unit([node]) for node in order}
        # Nodes inside subgraphs count as the top-level node that holds them.
        self._owner: dict[Node, Node] = {}
        for node in order:
            for sub in node.subgraphs():
                for inner in sub.all_nodes():
                    self._owner[inner] = node

    def unit(self, node: Node) -> _Unit:
        return self._unit[node]

    def groups(self) -> list[_Unit]:
        return list({id(u): u for u in self._unit.values()}.values())

    def merge(self, a: _Unit, b: _Unit) -> None:
        for node in b.members:
            self._unit[node] = a
        a.members.extend(b.members)

    def successors(self, unit: _Unit) -> list[_Unit]:
        found: dict[int, _Unit] = {}
        for node in unit.members:
            for value in node.outputs:
                for user, _ in value.uses():
                    top = self._owner.get(user, user)
                    if top in self._unit and self._unit[top] is not unit:
                        found[id(self._unit[top])] = self._unit[top]
        return list(found.values())

    def path_around(self, src: _Unit, dst: _Unit) -> Node | None:
        """A node on a path src → … → dst through another unit (merging would close a cycle), or None."""
        stack = [(u, u) for u in self.successors(src) if u is not dst]
        seen = {id(u) for u, _ in stack}
        while stack:
            unit, first = stack.pop()
            for nxt in self.successors(unit):
                if nxt is dst:
                    return first.members[0]
                if id(nxt) not in seen and nxt is not src:
                    seen.add(id(nxt))
                    stack.append((nxt, first))
        return None


def _fuse(graph: Graph, members: list[Node], steps: dict[Node, _Step], ctx: PassContext) -> str:
    """Replace `members` (in topological order) by one FusedPointwise node; return what was done."""
    inside = set(members)
    operand: dict[Value, int] = {}
    inputs: list[Value] = []
    program: list[tuple[str, list[int], dict[str, Any]]] = []
    pending_constants: list[tuple[Value, torch.Tensor]] = []

    def external(value: Value) -> int:
        if value not in operand:
            operand[value] = len(inputs)
            inputs.append(value)
        return operand[value]

    for node in members:
        step = steps[node]
        indices = []
        for item in step.operands:
            if isinstance(item, torch.Tensor):
                const = ctx.new_value(f"{node.outputs[0].name}_bound")
                pending_constants.append((const, item))
                indices.append(external(const))
            elif node.inputs[item].producer() in inside:
                indices.append(operand[node.inputs[item]])
            else:
                indices.append(external(node.inputs[item]))
        program.append((node.op_type, indices, step.attrs))
        operand[node.outputs[0]] = -1 - len(program)  # placeholder until the input count is known
    base = len(inputs)
    for _, indices, _ in program:
        indices[:] = [base + (-2 - i) if i < 0 else i for i in indices]  # step k was held as -2 - k
    exported = [node.outputs[0] for node in members if _used_outside(node.outputs[0], inside)]
    if not exported:
        return ""  # the whole group is dead: dead-code elimination removes it
    for const, tensor in pending_constants:
        add_initializer(graph, const, tensor)
    positions = [base + members.index(v.producer()) for v in exported]
    attributes: dict[str, Any] = {"program": pointwise_program(program)}
    if positions != [base + len(members) - 1]:
        attributes["outputs"] = positions
    new_outputs = [ctx.new_value(v.name, like=v) for v in exported]
    fused = Node(
        "FusedPointwise",
        inputs,
        new_outputs,
        attributes,
        domain=DOMAIN,
        name=ctx.fresh_name("fused_pointwise"),
    )
    replace_node(members[-1], fused, dict(zip(exported, new_outputs, strict=True)))
    for node in reversed(members[:-1]):
        graph.remove(node)
    ops = "+".join(node.op_type for node in members)
    return f"{len(members)} ops ({ops}) -> 1 node with {len(inputs)} inputs and {len(exported)} outputs"


def _used_outside(value: Value, inside: set[Node]) -> bool:
    return is_graph_output(value) or any(user not in inside for user, _ in value.uses())


def program_of(node: Node) -> list[tuple[str, list[int], dict[str, Any]]]:
    """The steps of a FusedPointwise node (for reports and tests)."""
    return [(op, list(args), dict(attrs)) for op, args, attrs in json.loads(node.attributes["program"])]
