import pytest

from tensorforge.errors import GraphError
from tensorforge.ir import DType, Graph, Node, Value, format_graph, topological_order, validate


def _chain():
    x = Value("x", DType.FLOAT, (1, "n"))
    a, b = Value("a"), Value("b")
    relu = Node("Relu", [x], [a], name="relu")
    neg = Node("Neg", [a], [b], name="neg")
    graph = Graph("g", inputs=[x], outputs=[b], nodes=[relu, neg])
    return graph, x, a, b, relu, neg


def test_use_def_links():
    graph, x, a, b, relu, neg = _chain()
    assert a.producer() is relu
    assert a.uses() == [(neg, 0)]
    assert x.producer() is None and x.uses() == [(relu, 0)]
    assert relu.graph is graph


def test_replace_all_uses_with_rewires_users():
    graph, x, a, b, relu, neg = _chain()
    a.replace_all_uses_with(x)
    assert neg.inputs == (x,)
    assert a.uses() == []
    assert sorted(u[0].name for u in x.uses()) == ["neg", "relu"]
    graph.remove(relu)
    assert graph.nodes == [neg]
    validate(graph)


def test_remove_refuses_a_node_whose_output_is_used():
    graph, *_, relu, _neg = _chain()
    with pytest.raises(ValueError, match="used by Neg node 'neg'"):
        graph.remove(relu)


def test_nodes_can_be_removed_while_iterating():
    graph, x, a, b, relu, neg = _chain()
    for node in graph:
        if node is relu:
            node.outputs[0].replace_all_uses_with(x)
            graph.remove(node)
    assert [n.name for n in graph] == ["neg"]


def test_sort_orders_producers_first_and_detects_cycles():
    graph, x, a, b, relu, neg = _chain()
    shuffled = Graph("g", inputs=[x], outputs=[b], nodes=[neg, relu])
    shuffled.sort()
    assert [n.name for n in shuffled] == ["relu", "neg"]
    c, d = Value("c"), Value("d")
    first = Node("Relu", [d], [c], name="first")
    second = Node("Relu", [c], [d], name="second")
    cyclic = Graph("cyclic", outputs=[d], nodes=[first, second])
    with pytest.raises(GraphError, match="cycle through 2 nodes"):
        topological_order(cyclic)


def test_validate_reports_dangling_inputs_and_missing_outputs():
    ghost = Value("ghost")
    out = Value("out")
    node = Node("Relu", [ghost], [out], name="r")
    graph = Graph("g", outputs=[out, Value("never")], nodes=[node])
    with pytest.raises(GraphError) as info:
        validate(graph)
    message = str(info.value)
    assert "Relu node 'r' reads input 0 'ghost', which nothing defines" in message
    assert "graph output 'never' is not produced" in message


def test_printer_shows_types_attributes_and_symbolic_dims():
    graph, *_ = _chain()
    graph.nodes[0].attributes["alpha"] = 0.5
    text = format_graph(graph)
    assert "%x: f32[1, n]" in text
    assert "Relu<alpha=0.5>(%x)" in text
    assert "return %b" in text
