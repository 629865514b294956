"""2:4 structured sparsity over a graph: the layers whose weights have the pattern, and pruning to it.

`prune_2to4` is what TensorRT's `--sparsity=force` does: every weight a sparse kernel could take
(`ops.structured_sparsity.weight_matrix`: products with a constant weight, 1×1 convolutions) loses the two
smallest magnitudes of every four along its reduction axis. It changes the model's answers, unlike every other
step of a build; a model meant to run sparse is pruned and fine-tuned before export (NVIDIA's ASP,
`torch.ao.pruning`), and then `sparse_layers` finds its pattern as it is.
"""

from __future__ import annotations

from ..ir import Model
from ..ops.structured_sparsity import GROUP, is_2to4, prune_2to4, weight_from_matrix, weight_matrix


def sparse_layers(model: Model) -> list[str]:
    """The labels of the layers whose weight matrix has the 2:4 pattern."""
    return [node.label for node in model.graph.nodes if _has_pattern(node)]


def prune_graph_2to4(model: Model) -> list[str]:
    """Prune, in place, every weight matrix of `model` whose reduction axis is a multiple of 4 to the 2:4 pattern
    (a weight several layers share, once). Returns the labels of the layers whose weights changed."""
    pruned, seen = [], set()
    for node in model.graph.nodes:
        matrix = weight_matrix(node)
        if matrix is None or matrix.shape[1] % GROUP or id(node.inputs[1]) in seen:
            continue
        seen.add(id(node.inputs[1]))
        if is_2to4(matrix):
            continue
        node.inputs[1].const = weight_from_matrix(node, prune_2to4(matrix))
        pruned.append(node.label)
    return pruned


def _has_pattern(node) -> bool:
    matrix = weight_matrix(node)
    return matrix is not None and is_2to4(matrix)
