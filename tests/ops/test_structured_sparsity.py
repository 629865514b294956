"""2:4 structured sparsity of a layer's weight: the matrix it is, the pattern check, magnitude pruning."""

import numpy as np
import pytest
import torch

from tensorforge.ir import DType, Node, Value
from tensorforge.ops.structured_sparsity import is_2to4, prune_2to4, weight_from_matrix, weight_matrix
from tests.helpers import fused_conv, fused_gemm


def test_pruning_keeps_the_two_largest_magnitudes_of_every_four():
    matrix = torch.tensor([[9.0, -1.0, 7.0, 4.0, 0.5, -3.0, 2.0, -2.5], [1.0, 2.0, 3.0, 0.0, -8.0, 8.0, 1.0, 1.0]])
    want = torch.tensor([[9.0, 0.0, 7.0, 0.0, 0.0, -3.0, 0.0, -2.5], [0.0, 2.0, 3.0, 0.0, -8.0, 8.0, 0.0, 0.0]])
    assert torch.equal(prune_2to4(matrix), want)
    assert is_2to4(want) and not is_2to4(matrix)


def test_ties_keep_the_earlier_weights_and_pruning_twice_changes_nothing():
    ones = torch.ones(3, 8)
    pruned = prune_2to4(ones)
    assert torch.equal(pruned, torch.tensor([[1.0, 1.0, 0.0, 0.0] * 2] * 3))
    random = prune_2to4(torch.randn(16, 64, generator=torch.Generator().manual_seed(0)))
    assert is_2to4(random) and torch.equal(prune_2to4(random), random)
    assert int(random.ne(0).sum()) == 16 * 32


def test_the_pattern_needs_a_reduction_axis_of_whole_fours():
    assert not is_2to4(torch.zeros(4, 6))
    assert is_2to4(torch.zeros(4, 8))
    assert not is_2to4(torch.zeros(0, 8))


@pytest.mark.parametrize("trans_b", [False, True])
def test_a_product_weight_is_read_as_n_by_k_and_written_back(trans_b):
    node, _ = fused_gemm([10, 32], trans_b=trans_b, matmul=False, n=16)
    matrix = weight_matrix(node)
    assert tuple(matrix.shape) == (16, 32)
    stored = node.inputs[1].const
    assert torch.equal(matrix, stored if trans_b else stored.t())
    assert torch.equal(weight_from_matrix(node, matrix), stored)


def test_only_ungrouped_1x1_convolutions_are_matrices():
    rng = np.random.default_rng(0)
    pointwise = fused_conv([1, 8, 5, 5], rng.standard_normal((16, 8, 1, 1)).astype(np.float32), None)
    matrix = weight_matrix(pointwise)
    assert tuple(matrix.shape) == (16, 8)
    assert torch.equal(weight_from_matrix(pointwise, matrix), pointwise.inputs[1].const)
    square = fused_conv([1, 8, 5, 5], rng.standard_normal((16, 8, 3, 3)).astype(np.float32), None)
    grouped = fused_conv([1, 8, 5, 5], rng.standard_normal((16, 4, 1, 1)).astype(np.float32), None, group=2)
    assert weight_matrix(square) is None and weight_matrix(grouped) is None


@pytest.mark.parametrize(
    ("op", "shape", "attributes", "transposed"),
    [("MatMul", (32, 16), {}, True), ("Gemm", (16, 32), {"transB": 1}, False), ("Conv", (16, 32, 1, 1), {}, False)],
)
def test_the_onnx_ops_count_so_a_model_can_be_pruned_before_it_is_optimized(op, shape, attributes, transposed):
    weight = torch.randn(shape)
    node = Node(op, [Value("x", DType.FLOAT), Value("w", DType.FLOAT, list(shape), const=weight)], [Value("y")])
    node.attributes.update(attributes)
    matrix = weight_matrix(node)
    assert tuple(matrix.shape) == (16, 32)
    assert torch.equal(matrix, weight.t() if transposed else weight.reshape(16, 32))
    assert torch.equal(weight_from_matrix(node, matrix), weight)
    node.attributes["transA"] = 1
    assert op != "Gemm" or weight_matrix(node) is None
