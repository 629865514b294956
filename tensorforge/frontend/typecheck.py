"""Type checking of imported nodes against the ONNX schemas' type constraints.

For each node with a known schema, every input's element type must be one the constraint allows, and inputs
bound to the same type variable (e.g. both operands `T` of Add) must agree. All problems are reported at once.
"""

from __future__ import annotations

import onnx.defs

from ..errors import GraphError
from ..ir import DType, Model, Node


def check_types(model: Model) -> None:
    problems: list[str] = []
    for node in model.graph.all_nodes():
        problems.extend(_check_node(node, model.opset(node.domain)))
    if problems:
        shown = problems[:20] + ([f"... and {len(problems) - 20} more"] if len(problems) > 20 else [])
        raise GraphError("type mismatches in the graph:\n  " + "\n  ".join(shown))


def _check_node(node: Node, opset: int) -> list[str]:
    try:
        schema = onnx.defs.get_schema(node.op_type, opset, node.domain or "")
    except onnx.defs.SchemaError:
        return []
    constraints = {c.type_param_str: set(c.allowed_type_strs) for c in schema.type_constraints}
    formals = schema.inputs
    if not formals:
        return []
    bound: dict[str, tuple[DType, int]] = {}
    problems = []
    for index, value in enumerate(node.inputs):
        if value is None or value.dtype == DType.UNDEFINED or (index >= len(formals) and not _variadic(formals)):
            continue
        formal = formals[min(index, len(formals) - 1)]
        type_var = formal.type_str
        type_name = f"tensor({value.dtype.name.lower()})"
        allowed = constraints.get(type_var)
        if allowed is not None and not any(a.startswith("tensor(") for a in allowed):
            continue  # sequence/optional-typed formal: element types are checked at run time
        if allowed is not None and type_name not in allowed:
            problems.append(
                f"{node.label}: input {index} {value.name!r} has type {value.dtype.name.lower()}, "
                f"which {node.op_type}-{schema.since_version} does not accept for {type_var}"
            )
            continue
        homogeneous = formal.option != onnx.defs.OpSchema.FormalParameterOption.Variadic or formal.is_homogeneous
        if type_var in constraints and homogeneous:
            previous = bound.setdefault(type_var, (value.dtype, index))
            if previous[0] != value.dtype:
                problems.append(
                    f"{node.label}: input {index} {value.name!r} is {value.dtype.name.lower()} but input "
                    f"{previous[1]} is {previous[0].name.lower()}; both must have the same type {type_var}"
                )
    return problems


def _variadic(formals) -> bool:
    return formals[-1].option == onnx.defs.OpSchema.FormalParameterOption.Variadic
