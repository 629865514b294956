"""The graph IR: `Graph`, `Node`, `Value`, element types, shapes, validation, a text printer
and a JSON + tensors serialization."""

from .dtypes import DType
from .graph import Dim, Graph, Model, Node, Shape, Value, format_shape, format_type, qualified_op
from .printer import format_graph
from .serialize import model_from_dict, model_to_dict
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
    "model_from_dict",
    "model_to_dict",
    "qualified_op",
    "topological_order",
    "validate",
]
