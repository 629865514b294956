"""Control flow: If, Loop and Scan, which run their GRAPH attributes through `ctx.run_subgraph`."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..ir import Graph, Value
from .helpers import normalize_axis
from .registry import OpContext, register


@register("If", since=1)
def if_op(ctx: OpContext, cond, *, then_branch, else_branch):
    """Run `then_branch` when `cond` holds, else `else_branch`; the branch outputs are the op's outputs."""
    branch = then_branch if bool(cond) else else_branch
    return tuple(ctx.run_subgraph(branch, []))


@register("Loop", since=1)
def loop(ctx: OpContext, M=None, cond=None, *v_initial, body):
    """Run `body(iteration, cond, *carried) -> (cond, *carried, *scan_elements)` while the iteration is
    below the trip count `M` and the condition holds (an absent `M` or `cond` does not limit; without a
    `cond` input the body's condition output is ignored). Returns the final loop-carried values and the
    scan elements of every iteration stacked along a new axis 0."""
    trip_count = None if M is None else int(M)
    keep_going = True if cond is None else bool(cond)
    carried = list(v_initial)
    scans: list[list[torch.Tensor]] = [[] for _ in body.outputs[1 + len(carried) :]]
    iteration = 0
    while keep_going and (trip_count is None or iteration < trip_count):
        args = [
            torch.tensor(iteration, dtype=torch.int64, device=ctx.device),
            torch.tensor(keep_going, device=ctx.device),
            *carried,
        ]
        outputs = ctx.run_subgraph(body, args)
        if cond is not None:
            keep_going = bool(outputs[0])
        carried = outputs[1 : 1 + len(carried)]
        for collected, element in zip(scans, outputs[1 + len(carried) :], strict=True):
            collected.append(element)
        iteration += 1
    stacked = [
        _stack(elements, value, ctx.device)
        for elements, value in zip(scans, body.outputs[1 + len(carried) :], strict=True)
    ]
    return (*carried, *stacked)


@register("Scan", since=9)
def scan(
    ctx: OpContext,
    *initial_state_and_scan_inputs,
    body,
    num_scan_inputs,
    scan_input_axes=None,
    scan_input_directions=None,
    scan_output_axes=None,
    scan_output_directions=None,
):
    """Iterate `body(*states, *scan_elements) -> (*states, *scan_output_elements)` over slices of the
    scan inputs along their `scan_input_axes` (reversed where the direction is 1); scan outputs are the
    elements stacked along `scan_output_axes` (in reverse order where the direction is 1). From opset 11
    axes may be negative."""
    num_states = len(initial_state_and_scan_inputs) - num_scan_inputs
    states = list(initial_state_and_scan_inputs[:num_states])
    scan_inputs = initial_state_and_scan_inputs[num_states:]
    num_outputs = len(body.outputs) - num_states
    axes = scan_input_axes or [0] * num_scan_inputs
    in_axes = [normalize_axis(a, x.dim()) for a, x in zip(axes, scan_inputs, strict=True)]
    in_dirs = scan_input_directions or [0] * num_scan_inputs
    length = scan_inputs[0].shape[in_axes[0]] if scan_inputs else 0
    states, elements = _iterate(ctx, body, states, scan_inputs, in_axes, in_dirs, length)
    out_dirs = scan_output_directions or [0] * num_outputs
    outputs = []
    for index, value in enumerate(body.outputs[num_states:]):
        series = elements[index][::-1] if out_dirs[index] else elements[index]
        stacked = _stack(series, value, ctx.device)
        axis = normalize_axis((scan_output_axes or [0] * num_outputs)[index], stacked.dim())
        outputs.append(torch.movedim(stacked, 0, axis))
    return (*states, *outputs)


@register("Scan", since=8)
def scan8(ctx: OpContext, sequence_lens=None, *initial_state_and_scan_inputs, body, num_scan_inputs, directions=None):
    """Scan with a batch axis 0 and the scan axis 1 on every input: each batch entry is scanned on its
    own, over its first `sequence_lens[b]` steps; scan outputs are zero-padded to the longest length."""
    num_states = len(initial_state_and_scan_inputs) - num_scan_inputs
    initial = initial_state_and_scan_inputs[:num_states]
    scan_inputs = initial_state_and_scan_inputs[num_states:]
    batch, max_length = scan_inputs[0].shape[:2]
    lengths = [max_length] * batch if sequence_lens is None else [int(n) for n in sequence_lens.tolist()]
    dirs = directions or [0] * num_scan_inputs
    final_states, scan_outputs = [], []
    for b in range(batch):
        inputs = [x[b, : lengths[b]] for x in scan_inputs]
        states = [s[b] for s in initial]
        states, elements = _iterate(ctx, body, states, inputs, [0] * num_scan_inputs, dirs, lengths[b])
        final_states.append(states)
        padded = []
        for series, value in zip(elements, body.outputs[num_states:], strict=True):
            stacked = _stack(series, value, ctx.device)
            pad = stacked.new_zeros((max_length - lengths[b], *stacked.shape[1:]))
            padded.append(torch.cat([stacked, pad]))
        scan_outputs.append(padded)
    states_out = [torch.stack(list(group)) for group in zip(*final_states, strict=True)]
    outputs_out = [torch.stack(list(group)) for group in zip(*scan_outputs, strict=True)]
    return (*states_out, *outputs_out)


def _iterate(
    ctx: OpContext,
    body: Graph,
    states: list,
    scan_inputs: Sequence[torch.Tensor],
    axes: Sequence[int],
    directions: Sequence[int],
    length: int,
) -> tuple[list, list[list[torch.Tensor]]]:
    """Run `body` `length` times; return the final states and the per-step scan-output elements."""
    num_states = len(states)
    elements: list[list[torch.Tensor]] = [[] for _ in body.outputs[num_states:]]
    for step in range(length):
        slices = [
            x.select(axis, length - 1 - step if reverse else step)
            for x, axis, reverse in zip(scan_inputs, axes, directions, strict=True)
        ]
        outputs = ctx.run_subgraph(body, [*states, *slices])
        states = list(outputs[:num_states])
        for collected, element in zip(elements, outputs[num_states:], strict=True):
            collected.append(element)
    return states, elements


def _stack(elements: list[torch.Tensor], value: Value, device: torch.device) -> torch.Tensor:
    """Stack the per-iteration `elements` along a new axis 0; with no iterations, an empty tensor shaped
    like the body output `value` declares (unknown dims taken as 0)."""
    if elements:
        return torch.stack(elements)
    shape = [d if isinstance(d, int) else 0 for d in value.shape or ()]
    return torch.empty((0, *shape), dtype=value.dtype.torch, device=device)
