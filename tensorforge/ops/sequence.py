"""Sequence and optional ops. A sequence is a Python list of tensors; an empty optional is None."""

from __future__ import annotations

import torch

from .helpers import normalize_axis, to_ints
from .registry import OpContext, register


def _position(position, length: int, *, inserting: bool = False) -> int:
    """A non-negative index from a position tensor in [-length, length) ([-length, length] to insert)."""
    index = int(position)
    upper = length + 1 if inserting else length
    if not -length <= index < upper:
        raise IndexError(f"position {index} is out of range for a sequence of length {length}")
    return index + length if index < 0 else index


@register("SequenceEmpty", since=11)
def sequence_empty(ctx: OpContext, *, dtype=None):
    return []


@register("SequenceConstruct", since=11)
def sequence_construct(ctx: OpContext, *inputs):
    return list(inputs)


@register("SequenceInsert", since=11)
def sequence_insert(ctx: OpContext, input_sequence, tensor, position=None):
    """Insert `tensor` before `position` (appended when absent)."""
    result = list(input_sequence)
    if position is None:
        result.append(tensor)
    else:
        result.insert(_position(position, len(result), inserting=True), tensor)
    return result


@register("SequenceAt", since=11)
def sequence_at(ctx: OpContext, input_sequence, position):
    return input_sequence[_position(position, len(input_sequence))]


@register("SequenceErase", since=11)
def sequence_erase(ctx: OpContext, input_sequence, position=None):
    """Remove the element at `position` (the last one when absent)."""
    result = list(input_sequence)
    index = len(result) - 1 if position is None else _position(position, len(result))
    del result[index]
    return result


@register("SequenceLength", since=11)
def sequence_length(ctx: OpContext, input_sequence):
    return torch.tensor(len(input_sequence), dtype=torch.int64, device=ctx.device)


@register("SplitToSequence", since=11)
def split_to_sequence(ctx: OpContext, input, split=None, *, axis=0, keepdims=1):
    """Split along `axis` into pieces of `split` (a scalar chunk size or a list of sizes); without
    `split`, into pieces of size 1, squeezed unless `keepdims`."""
    axis = normalize_axis(axis, input.dim())
    if split is None:
        pieces = torch.split(input, 1, dim=axis)
        return [p if keepdims else p.squeeze(axis) for p in pieces]
    if split.dim() == 0:
        return list(torch.split(input, int(split), dim=axis))
    return list(torch.split(input, to_ints(split), dim=axis))


@register("ConcatFromSequence", since=11)
def concat_from_sequence(ctx: OpContext, input_sequence, *, axis, new_axis=0):
    """Concatenate along `axis`, or stack along a new `axis` when `new_axis` is 1."""
    rank = input_sequence[0].dim()
    if new_axis:
        return torch.stack(input_sequence, dim=normalize_axis(axis, rank + 1))
    return torch.cat(input_sequence, dim=normalize_axis(axis, rank))


@register("SequenceMap", since=17)
def sequence_map(ctx: OpContext, input_sequence, *additional_inputs, body):
    """Run `body` once per element of the sequences; tensor inputs are passed unchanged every time.
    Each body output is collected into an output sequence."""
    inputs = (input_sequence, *additional_inputs)
    results: list[list] = [[] for _ in body.outputs]
    for index in range(len(input_sequence)):
        args = [x[index] if isinstance(x, list) else x for x in inputs]
        for collected, value in zip(results, ctx.run_subgraph(body, args), strict=True):
            collected.append(value)
    return tuple(results)


@register("Optional", since=15)
def optional(ctx: OpContext, input=None, *, type=None):
    """An optional holding `input`, or an empty one (None) of `type`."""
    return input


@register("OptionalHasElement", since=15)
def optional_has_element(ctx: OpContext, input=None):
    """Whether the optional holds a value; from opset 18 the input itself may be absent (false)."""
    return torch.tensor(input is not None, device=ctx.device)


@register("OptionalGetElement", since=15)
def optional_get_element(ctx: OpContext, input):
    """The value of an optional (from opset 18 a plain tensor or sequence passes through)."""
    if input is None:
        raise ValueError("OptionalGetElement on an empty optional")
    return input
