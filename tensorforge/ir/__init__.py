"""The graph IR: `Graph`, `Node`, `Value`, element types, shapes, validation and a text printer."""

from .dtypes import DType
from .graph import Dim, Graph, Model, Node, Shape, Value, format_shape, format_type, qualified_op
from .printer import format_graph
from .validate import topological_order, validate

__all__ = [
    "DType",
    "Dim",
    "Graph",
    "Model",
    "Node",
    "Shape",
    "Value",
    "format_graph",
    "format_shape",
    "format_type",
    "qualified_op",
    "topological_order",
    "validate",
]
