import json

import numpy as np
import pytest
import torch
from torch import nn

import tensorforge
from tensorforge.build.memory import INPLACE_OPS, MemoryPlan, TensorLife, plan_graph, plan_memory
from tensorforge.errors import GraphError
from tensorforge.ir import DType, Graph, Model, Node, Value
from tensorforge.ops import load_all
from tensorforge.ops.registry import REGISTRY, OpContext

# -- helpers ------------------------------------------------------------------------------------------------


def aligned(size: int, alignment: int) -> int:
    return -(-size // alignment) * alignment


def chain_roots(plan: MemoryPlan) -> dict[str, str]:
    """Each tensor's in-place chain root (itself when it owns its storage)."""
    roots = {}
    for name in plan.offsets:
        root = name
        while root in plan.inplace:
            root = plan.inplace[root]
        roots[name] = root
    return roots


def assert_valid(plan: MemoryPlan, lives: list[TensorLife]) -> None:
    """Offsets aligned, live tensors disjoint, arena between the liveness bound and the naive sum."""
    a = plan.alignment
    assert set(plan.offsets) == {life.name for life in lives}
    roots = chain_roots(plan)
    for life in lives:
        offset = plan.offsets[life.name]
        assert offset % a == 0, life
        assert offset + life.size_bytes <= plan.arena_bytes
        assert plan.sizes[life.name] == life.size_bytes
    for i, x in enumerate(lives):
        for y in lives[i + 1 :]:
            overlap_in_time = x.first_step <= y.last_step and y.first_step <= x.last_step
            if not overlap_in_time or not x.size_bytes or not y.size_bytes or roots[x.name] == roots[y.name]:
                continue
            x0, y0 = plan.offsets[x.name], plan.offsets[y.name]
            assert x0 + aligned(x.size_bytes, a) <= y0 or y0 + aligned(y.size_bytes, a) <= x0, (x, y)
    assert plan.lower_bound_bytes <= plan.arena_bytes <= plan.naive_bytes
    assert plan.naive_bytes == sum(aligned(life.size_bytes, a) for life in lives)


def brute_force_bound(lives: list[TensorLife], alignment: int, roots: dict[str, str]) -> int:
    """Max over steps of the aligned bytes live there, an in-place chain counted once (by its root)."""
    by_name = {life.name: life for life in lives}
    chain_span: dict[str, list[int]] = {}
    for life in lives:
        span = chain_span.setdefault(roots[life.name], [life.first_step, life.last_step])
        span[0], span[1] = min(span[0], life.first_step), max(span[1], life.last_step)
    last = max((life.last_step for life in lives), default=-1)
    return max(
        (
            sum(aligned(by_name[root].size_bytes, alignment) for root, (f, l) in chain_span.items() if f <= s <= l)
            for s in range(last + 1)
        ),
        default=0,
    )


def random_schedule(rng: np.random.Generator, inplace: bool) -> list[TensorLife]:
    count = int(rng.integers(1, 60))
    steps = int(rng.integers(1, 40))
    lives = []
    for index in range(count):
        first = int(rng.integers(0, steps))
        last = first + int(rng.integers(0, 8))
        size = int(rng.choice([0, 1, 7, 255, 256, 300, 1000, 4096, 12345, 1 << 20]))
        lives.append(TensorLife(f"t{index}", size, first, last))
    if inplace:
        taken: set[str] = set()
        for index, life in enumerate(lives):
            targets = [
                t
                for t in lives
                if t.last_step == life.first_step
                and t.first_step < life.first_step
                and t.size_bytes >= life.size_bytes
                and t.name not in taken
            ]
            if targets and rng.random() < 0.7:
                target = targets[int(rng.integers(len(targets)))]
                taken.add(target.name)
                lives[index] = TensorLife(life.name, life.size_bytes, life.first_step, life.last_step, target.name)
    return lives


# -- the planner on schedules -------------------------------------------------------------------------------


@pytest.mark.parametrize("alignment", [1, 64, 256])
@pytest.mark.parametrize("inplace", [False, True])
def test_random_schedules_keep_the_invariants(alignment, inplace):
    rng = np.random.default_rng(1234 + alignment + inplace)
    reused = 0
    for _ in range(60):
        lives = random_schedule(rng, inplace)
        plan = plan_memory(lives, alignment)
        assert_valid(plan, lives)
        assert plan.lower_bound_bytes == brute_force_bound(lives, alignment, chain_roots(plan))
        assert plan.inplace == {life.name: life.inplace_of for life in lives if life.inplace_of}
        reused += len(plan.inplace)
    assert (reused > 0) == inplace


def test_greedy_by_size_reuses_dead_tensors():
    lives = [TensorLife("a", 100, 0, 1), TensorLife("b", 50, 1, 2), TensorLife("c", 100, 2, 3)]
    plan = plan_memory(lives, alignment=1)
    assert plan.offsets["a"] == plan.offsets["c"] == 0
    assert plan.offsets["b"] == 100
    assert plan.arena_bytes == plan.lower_bound_bytes == 150
    assert plan.naive_bytes == 250


def test_best_fit_takes_the_smallest_gap_that_fits():
    # At step 5 only a, c and f are live (at 0, 180 and 310): gaps of 80 bytes at 100 and 60 bytes at 250.
    lives = [
        TensorLife("a", 100, 0, 9),
        TensorLife("b", 80, 0, 1),
        TensorLife("c", 70, 0, 9),
        TensorLife("d", 60, 0, 1),
        TensorLife("f", 50, 0, 9),
        TensorLife("g", 45, 5, 9),
    ]
    plan = plan_memory(lives, alignment=1)
    assert [plan.offsets[n] for n in "abcdf"] == [0, 100, 180, 250, 310]
    assert plan.offsets["g"] == 250  # first fit would have taken 100
    assert plan.arena_bytes == 360


def test_alignment_rounds_every_tensor_up():
    lives = [TensorLife("a", 1, 0, 0), TensorLife("b", 257, 0, 0), TensorLife("c", 3, 0, 0)]
    plan = plan_memory(lives)
    assert plan.alignment == 256
    assert sorted(plan.offsets.values()) == [0, 512, 768]
    assert plan.arena_bytes == plan.lower_bound_bytes == plan.naive_bytes == 1024


def test_empty_and_zero_sized_schedules():
    plan = plan_memory([])
    assert (plan.arena_bytes, plan.naive_bytes, plan.lower_bound_bytes) == (0, 0, 0)
    assert "n/a" in plan.report()
    plan = plan_memory([TensorLife("empty", 0, 0, 3), TensorLife("x", 10, 1, 2)])
    assert plan.offsets == {"empty": 0, "x": 0}
    assert plan.arena_bytes == 256


def test_inplace_shares_storage_and_saves_memory():
    conv = TensorLife("conv", 1000, 0, 1)
    relu = TensorLife("relu", 1000, 1, 2, inplace_of="conv")
    pool = TensorLife("pool", 500, 2, 3, inplace_of="relu")  # smaller outputs may take over too
    other = TensorLife("other", 2000, 0, 3)
    plan = plan_memory([conv, relu, pool, other])
    assert plan.offsets["conv"] == plan.offsets["relu"] == plan.offsets["pool"]
    assert plan.inplace == {"relu": "conv", "pool": "relu"}
    assert plan.arena_bytes == plan.lower_bound_bytes == 1024 + 2048
    without = plan_memory([conv, TensorLife("relu", 1000, 1, 2), TensorLife("pool", 500, 2, 3), other])
    assert without.arena_bytes == 1024 + 1024 + 2048  # conv and relu are both live at step 1
    assert_valid(plan, [conv, relu, pool, other])


def test_inplace_chain_keeps_clear_of_tensors_live_beside_it():
    lives = [
        TensorLife("x", 4096, 0, 1),
        TensorLife("y", 4096, 1, 4, inplace_of="x"),
        TensorLife("side", 8192, 2, 3),
        TensorLife("early", 8192, 0, 0),
    ]
    plan = plan_memory(lives)
    assert_valid(plan, lives)
    x0, side0 = plan.offsets["x"], plan.offsets["side"]
    assert x0 + 4096 <= side0 or side0 + 8192 <= x0
    assert plan.offsets["early"] == plan.offsets["side"]  # early dies before side is born


@pytest.mark.parametrize(
    ("lives", "message"),
    [
        ([TensorLife("a", -1, 0, 0)], "negative size"),
        ([TensorLife("a", 1, 3, 2)], "invalid lifetime"),
        ([TensorLife("a", 1, -1, 2)], "invalid lifetime"),
        ([TensorLife("a", 1, 0, 0), TensorLife("a", 1, 1, 1)], "appears twice"),
        ([TensorLife("a", 1, 0, 1, inplace_of="ghost")], "'ghost', which is not another tensor"),
        ([TensorLife("a", 1, 0, 1, inplace_of="a")], "not another tensor"),
        ([TensorLife("a", 8, 0, 2), TensorLife("b", 8, 1, 2, inplace_of="a")], "dies at step 2, not at step 1"),
        ([TensorLife("a", 4, 0, 1), TensorLife("b", 8, 1, 2, inplace_of="a")], "smaller"),
        (
            [TensorLife("a", 8, 0, 1), TensorLife("b", 8, 1, 2, "a"), TensorLife("c", 8, 1, 2, "a")],
            "'b' already takes over",
        ),
        ([TensorLife("a", 8, 1, 1, "b"), TensorLife("b", 8, 1, 1, "a")], "cycle"),
    ],
)
def test_bad_schedules_are_refused(lives, message):
    with pytest.raises(ValueError, match=message):
        plan_memory(lives)


@pytest.mark.parametrize("alignment", [0, -256, 3, 96])
def test_bad_alignment_is_refused(alignment):
    with pytest.raises(ValueError, match="power of two"):
        plan_memory([TensorLife("a", 1, 0, 0)], alignment)


def test_report_and_header_round_trip():
    lives = [TensorLife("a", 3 << 20, 0, 1), TensorLife("b", 1 << 20, 1, 2, "a"), TensorLife("c", 1 << 20, 0, 2)]
    plan = plan_memory(lives)
    text = plan.report()
    assert "3 tensors, 1 in place" in text
    assert "4.000 MiB" in text  # arena and bound: a/b's block (3 MiB) beside c (1 MiB)
    assert "5.000 MiB" in text  # naive sum
    assert "arena/naive 0.800" in text and "arena/bound 1.000" in text
    again = MemoryPlan.from_dict(json.loads(json.dumps(plan.to_dict())))
    assert again == plan
    with pytest.raises(ValueError, match="malformed.*rebuild"):
        MemoryPlan.from_dict({"tensors": {"a": [0]}})


# -- plan_graph on IR graphs --------------------------------------------------------------------------------


def f32(name: str, shape, dtype: DType = DType.FLOAT) -> Value:
    return Value(name, dtype, tuple(shape))


def small_graph() -> Graph:
    """x -Mul(w)-> m -Relu-> r -Add(bias)-> s -Transpose-> t -Add(m)-> y  (m is read again at the end)."""
    x, w = f32("x", [2, 8]), Value("w", DType.FLOAT, (2, 8), const=torch.ones(2, 8))
    bias = Value("bias", DType.FLOAT, (8,), const=torch.zeros(8))
    m, r, s, t, y = f32("m", [2, 8]), f32("r", [2, 8]), f32("s", [2, 8]), f32("t", [8, 2]), f32("y", [8, 2])
    mt = f32("mt", [8, 2])
    nodes = [
        Node("Mul", [x, w], [m]),
        Node("Relu", [m], [r]),  # m is read later: no in-place
        Node("Add", [bias, r], [s]),  # takes r's place, not bias's (a constant of another shape)
        Node("Transpose", [s], [t], {"perm": [1, 0]}),  # not elementwise
        Node("Transpose", [m], [mt], {"perm": [1, 0]}),
        Node("Add", [t, mt], [y]),  # y is a graph output
    ]
    return Graph("small", [x], [y], nodes, [w, bias])


def test_plan_graph_lifetimes_and_inplace():
    plan = plan_graph(small_graph())
    assert set(plan.offsets) == {"m", "r", "s", "t", "mt"}  # no inputs, constants or outputs
    assert plan.inplace == {"s": "r"}
    assert all(size == 2 * 8 * 4 for size in plan.sizes.values())
    assert plan.offsets["s"] == plan.offsets["r"]
    assert len({plan.offsets[n] for n in ("m", "t", "mt")}) == 3  # all live at step 4
    # s stays live as long as t, its transpose (a view of s in torch), does: four blocks live at step 5.
    assert plan.arena_bytes == plan.lower_bound_bytes == 4 * 256


def test_a_tensor_lives_while_its_views_do_and_one_viewed_by_an_output_stays_out():
    """x -Relu-> a -Split-> (s0, s1); s0 -Relu-> b -Relu-> c; (s1 + c) -> y. The Split's outputs are views of
    a: a must not be overwritten by b or c while s1 is still to be read."""
    x, a, s0, s1 = f32("x", [2, 8]), f32("a", [2, 8]), f32("s0", [1, 8]), f32("s1", [1, 8])
    b, c, y = f32("b", [1, 8]), f32("c", [1, 8]), f32("y", [1, 8])
    nodes = [
        Node("Relu", [x], [a]),
        Node("Split", [a], [s0, s1], {"axis": 0}),
        Node("Relu", [s0], [b]),
        Node("Relu", [b], [c]),
        Node("Add", [s1, c], [y]),
    ]
    plan = plan_graph(Graph("g", [x], [y], nodes), outside={"s0", "s1"})
    assert plan.offsets["a"] not in (plan.offsets["b"], plan.offsets["c"])
    x, a, s0, s1 = f32("x", [2, 8]), f32("a", [2, 8]), f32("s0", [1, 8]), f32("s1", [1, 8])
    viewed = Graph("g", [x], [s1], [Node("Relu", [x], [a]), Node("Split", [a], [s0, s1], {"axis": 0})])
    assert "a" not in plan_graph(viewed, outside={"s0"}).offsets  # the output s1 looks into a


def test_plan_graph_outputs_and_inputs_when_asked():
    plan = plan_graph(small_graph(), exclude_outputs=False, include_inputs=True)
    assert set(plan.offsets) == {"x", "m", "r", "s", "t", "mt", "y"}
    assert "w" not in plan.offsets and "bias" not in plan.offsets
    assert plan.inplace == {"m": "x", "s": "r", "y": "t"}  # x dies at the Mul (in the arena, it is a copy)
    assert plan.sizes["x"] == plan.sizes["y"] == 64


def test_plan_graph_needs_same_shape_and_dtype_for_inplace():
    x = f32("x", [4, 4])
    a, b = f32("a", [4, 1]), f32("b", [4, 4])  # a broadcasts into b's shape
    h, c, out = f32("h", [4, 4], DType.FLOAT16), f32("c", [4, 4], DType.FLOAT16), f32("out", [4, 4], DType.FLOAT16)
    nodes = [
        Node("ReduceMax", [x], [a], {"axes": [1]}),
        Node("Add", [a, x], [b]),  # x is a graph input: stays out of the arena
        Node("Cast", [b], [h], {"to": int(DType.FLOAT16)}),  # dtype changes: no in-place
        Node("Sigmoid", [h], [c]),
        Node("Neg", [c], [out]),
    ]
    plan = plan_graph(Graph("g", [x], [out], nodes))
    assert plan.inplace == {"c": "h"}
    assert plan.sizes == {"a": 16, "b": 64, "h": 32, "c": 32}


def test_plan_graph_sizes_follow_dtype_bits():
    x = f32("x", [3, 5], DType.INT4)
    y, z = f32("y", [3, 5], DType.INT4), f32("z", [3, 5], DType.BOOL)
    graph = Graph("g", [x], [z], [Node("Neg", [x], [y]), Node("IsNaN", [y], [z])])
    assert plan_graph(graph).sizes == {"y": 8}  # 15 four-bit elements in 8 bytes


def test_plan_graph_refuses_dynamic_shapes_and_names_the_value():
    x, y, z = f32("x", ["batch", 8]), f32("y", ["batch", 8]), f32("z", ["batch", 8])
    graph = Graph("g", [x], [z], [Node("Relu", [x], [y]), Node("Neg", [y], [z])])
    with pytest.raises(GraphError, match=r"value 'y'.*\[batch, 8\].*`shapes`"):
        plan_graph(graph)
    plan = plan_graph(graph, shapes={"y": (4, 8)})
    assert plan.sizes == {"y": 128}
    graph.nodes[0].outputs[0].shape = None
    with pytest.raises(GraphError, match="value 'y'.*unknown"):
        plan_graph(graph)


def test_plan_graph_refuses_strings():
    x, y, z = f32("x", [2]), f32("y", [2], DType.STRING), f32("z", [2])
    graph = Graph("g", [x], [z], [Node("Cast", [x], [y], {"to": 8}), Node("Cast", [y], [z], {"to": 1})])
    with pytest.raises(GraphError, match="value 'y'.*STRING"):
        plan_graph(graph)


def test_inplace_group_is_elementwise():
    assert ("", "Relu") in INPLACE_OPS and ("", "Add") in INPLACE_OPS
    assert ("tensorforge", "FusedPointwise") in INPLACE_OPS
    for op in ("Conv", "MatMul", "Transpose", "Reshape", "Softmax", "Concat", "MaxPool"):
        assert ("", op) not in INPLACE_OPS


# -- real graphs, run out of the arena ----------------------------------------------------------------------


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        identity = x if self.down is None else self.down(x)
        out = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(out)) + identity)


class TinyResNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, 2, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU())
        self.pool = nn.MaxPool2d(3, 2, 1)
        self.blocks = nn.Sequential(BasicBlock(16, 16, 1), BasicBlock(16, 32, 2), BasicBlock(32, 32, 1))
        self.head = nn.Linear(32, 10)

    def forward(self, x):
        x = self.blocks(self.pool(self.stem(x)))
        return self.head(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))


def run_in_arena(model: Model, plan: MemoryPlan, feeds: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Run the graph with every planned tensor stored in one byte arena, filled with garbage first."""
    load_all()
    graph = model.graph
    arena = torch.randint(0, 256, (plan.arena_bytes,), dtype=torch.uint8)
    env = {name: value.const for name, value in graph.initializers.items()} | dict(feeds)
    for node in graph.nodes:
        op_def = REGISTRY.lookup(node.op_type, node.domain, model.opset(node.domain))
        ctx = OpContext(node, model.opset(node.domain), torch.device("cpu"), output_dtypes=(node.outputs[0].dtype,))
        result = op_def.impl(ctx, *[env[v.name] if v else None for v in node.inputs], **node.attributes)
        for value, tensor in zip(node.outputs, result if isinstance(result, tuple) else (result,), strict=False):
            name = value.name
            if name not in plan.offsets:
                env[name] = tensor
                continue
            start = plan.offsets[name]
            view = arena[start : start + plan.sizes[name]].view(tensor.dtype).view(tensor.shape)
            view.copy_(tensor)
            env[name] = view
    return {value.name: env[value.name] for value in graph.outputs}


def check_real_plan(model: Model, example: torch.Tensor) -> MemoryPlan:
    executor = tensorforge.Executor(model)  # sorts the graph: plan the order that runs
    plan = plan_graph(model.graph)
    assert plan.lower_bound_bytes <= plan.arena_bytes <= 1.10 * plan.lower_bound_bytes
    assert plan.arena_bytes < plan.naive_bytes / 2
    assert all(offset % plan.alignment == 0 for offset in plan.offsets.values())
    relus = [n for n in model.graph.nodes if n.op_type == "Relu"]
    assert relus and all(n.outputs[0].name in plan.inplace for n in relus)
    feeds = {model.graph.inputs[0].name: example}
    expected = executor.run(feeds)
    with torch.inference_mode():
        got = run_in_arena(model, plan, feeds)
    for name, tensor in expected.items():
        torch.testing.assert_close(got[name], tensor, rtol=0, atol=0)
    return plan


def test_resnet_style_module_plans_near_the_bound_and_runs_from_the_arena():
    torch.manual_seed(0)
    module = TinyResNet().eval()
    example = torch.randn(1, 3, 32, 32)
    plan = check_real_plan(tensorforge.from_torch(module, example), example)
    assert "arena/bound" in plan.report()


@pytest.mark.slow
def test_resnet50_at_224():
    zoo = pytest.importorskip("tensorforge.zoo")
    from tensorforge.frontend import import_model

    model = import_model(zoo.export("resnet50", dynamic_batch=False, size=224))
    example = torch.randn(1, 3, 224, 224, generator=torch.Generator().manual_seed(0))
    plan = check_real_plan(model, example)
    assert plan.arena_bytes < 16 * 2**20  # the largest activation is 64×112×112 floats, 3 MiB


def test_plan_graph_counts_reads_inside_subgraphs():
    x, cond = f32("x", [4]), f32("cond", [], DType.BOOL)
    a, b, out = f32("a", [4]), f32("b", [4]), f32("out", [4])
    then_out, else_out = f32("then_out", [4]), f32("else_out", [4])
    then_branch = Graph("then", [], [then_out], [Node("Identity", [a], [then_out])])
    else_branch = Graph("else", [], [else_out], [Node("Identity", [b], [else_out])])
    nodes = [
        Node("Relu", [x], [a]),
        Node("Neg", [a], [b]),  # a is read again inside the If: b may not take its place
        Node("If", [cond], [out], {"then_branch": then_branch, "else_branch": else_branch}),
    ]
    plan = plan_graph(Graph("g", [x, cond], [out], nodes))
    assert set(plan.offsets) == {"a", "b"}
    assert plan.inplace == {}
    assert plan.offsets["a"] != plan.offsets["b"]


def concat_graph() -> Graph:
    """x -Relu-> a -Relu-> b -Sigmoid-> c; Concat(a, c) -> cat -Neg-> y. With a and c inside cat, cat lives from a's
    step to its last read, and b (live beside it) gets other bytes."""
    x = f32("x", [1, 4, 2, 2])
    a, b, c = f32("a", [1, 4, 2, 2]), f32("b", [1, 4, 2, 2]), f32("c", [1, 4, 2, 2])
    cat, y = f32("cat", [1, 8, 2, 2]), f32("y", [1, 8, 2, 2])
    nodes = [
        Node("Relu", [x], [a]),
        Node("Relu", [a], [b]),
        Node("Sigmoid", [b], [c]),  # b dies here: c could take its place, but c lives inside cat
        Node("Concat", [a, c], [cat], {"axis": 1}),
        Node("Neg", [cat], [y]),
    ]
    return Graph("concat", [x], [y], nodes)


def test_tensors_planned_inside_their_concatenation():
    plan = plan_graph(concat_graph(), views={"a": ("cat", 0), "c": ("cat", 4)})
    assert plan.views == {"a": ("cat", 0), "c": ("cat", 4)}
    assert plan.offsets["a"] == plan.offsets["c"] == plan.offsets["cat"]
    assert plan.sizes["a"] == plan.sizes["c"] == 64 and plan.sizes["cat"] == 128
    assert "c" not in plan.inplace and "c" not in plan.inplace.values()
    # cat's block is live from step 0 (a) to step 4, so b (steps 1-2) must lie outside it
    cat_start, cat_end = plan.offsets["cat"], plan.offsets["cat"] + 256
    assert not cat_start <= plan.offsets["b"] < cat_end
    assert "2 written into their concatenation" in plan.report()
    assert MemoryPlan.from_dict(json.loads(json.dumps(plan.to_dict()))) == plan


def test_views_of_unplanned_tensors_are_dropped():
    """A view whose tensor its kernel allocates (outside), or of a concatenation that is not planned, is ignored."""
    plan = plan_graph(concat_graph(), outside={"a"}, views={"a": ("cat", 0), "c": ("cat", 4), "b": ("y", 0)})
    assert plan.views == {"c": ("cat", 4)}
    assert "a" not in plan.offsets and plan.outside["a"] == 64
