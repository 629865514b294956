"""Recurrent layers: RNN, GRU and LSTM.

All three share one driver: X is [seq, batch, input] (layout 0) or [batch, seq, input] (layout 1); W, R
and B hold the gates of each direction; Y is [seq, num_directions, batch, hidden] (layout 1: [batch, seq,
num_directions, hidden]) and Y_h / Y_c are [num_directions, batch, hidden] (layout 1: batch first).
With `sequence_lens`, batch entry b runs its first `sequence_lens[b]` steps only (a reverse direction
starts at step `sequence_lens[b] - 1`); later Y rows are zero and the states stop updating.
Half-precision inputs are computed in float32.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F

from .helpers import upcast
from .registry import OpContext, register

Activation = Callable[[torch.Tensor], torch.Tensor]
# cell(x_gates, states, R, Rb, activations, extra) -> new states; states[0] is the hidden state
Cell = Callable[..., tuple[torch.Tensor, ...]]

# name -> (builder from (alpha, beta), default alpha, default beta); None: the function takes no parameter
_ACTIVATIONS: dict[str, tuple[Callable[[float, float], Activation], float | None, float | None]] = {
    "relu": (lambda a, b: torch.relu, None, None),
    "tanh": (lambda a, b: torch.tanh, None, None),
    "sigmoid": (lambda a, b: torch.sigmoid, None, None),
    "softsign": (lambda a, b: F.softsign, None, None),
    "softplus": (lambda a, b: F.softplus, None, None),
    "affine": (lambda a, b: lambda x: a * x + b, 1.0, 0.0),
    "leakyrelu": (lambda a, b: lambda x: F.leaky_relu(x, a), 0.01, None),
    "thresholdedrelu": (lambda a, b: lambda x: torch.where(x > a, x, 0.0), 1.0, None),
    "scaledtanh": (lambda a, b: lambda x: a * torch.tanh(b * x), 1.0, 1.0),
    "hardsigmoid": (lambda a, b: lambda x: torch.clamp(a * x + b, 0.0, 1.0), 0.2, 0.5),
    "elu": (lambda a, b: lambda x: F.elu(x, a), 1.0, None),
}


def _activations(
    names: Sequence[str] | None,
    defaults: Sequence[str],
    alphas: Sequence[float] | None,
    betas: Sequence[float] | None,
    num_directions: int,
) -> list[list[Activation]]:
    """The activation functions of each direction. `activation_alpha`/`beta` are consumed in order by
    the functions that take that parameter; missing ones take the function's default."""
    names = list(names) if names else list(defaults) * num_directions
    if len(names) == len(defaults) and num_directions == 2:
        names = names * 2
    alpha_iter, beta_iter = iter(alphas or []), iter(betas or [])
    functions = []
    for name in names:
        try:
            build, alpha, beta = _ACTIVATIONS[name.lower()]
        except KeyError:
            raise ValueError(f"unknown recurrent activation {name!r}") from None
        alpha = alpha if alpha is None else next(alpha_iter, alpha)
        beta = beta if beta is None else next(beta_iter, beta)
        functions.append(build(alpha, beta))
    per_direction = len(defaults)
    return [functions[d * per_direction : (d + 1) * per_direction] for d in range(num_directions)]


def _recurrent(
    ctx: OpContext,
    cell: Cell,
    num_gates: int,
    default_activations: Sequence[str],
    x: torch.Tensor,
    w: torch.Tensor,
    r: torch.Tensor,
    b: torch.Tensor | None,
    sequence_lens: torch.Tensor | None,
    initial_states: Sequence[torch.Tensor | None],
    extra: torch.Tensor | None,
    *,
    activation_alpha,
    activation_beta,
    activations,
    clip,
    direction: str,
    hidden_size,
    layout: int,
) -> tuple[torch.Tensor | None, ...]:
    """Run `cell` over the sequence in each direction; returns (Y, final state per state tensor)."""
    dtype = x.dtype
    x, w, r = upcast(x), upcast(w), upcast(r)
    if layout:
        x = x.transpose(0, 1)
        initial_states = [None if s is None else s.transpose(0, 1) for s in initial_states]
    seq_length, batch = x.shape[:2]
    num_directions = w.shape[0]
    hidden = hidden_size or r.shape[-1]
    if direction not in ("forward", "reverse", "bidirectional"):
        raise ValueError(f"unknown direction {direction!r}")
    if (direction == "bidirectional") != (num_directions == 2):
        raise ValueError(f"direction {direction!r} does not match W with {num_directions} directions")
    if b is None:
        b = x.new_zeros((num_directions, 2 * num_gates * hidden))
    b = upcast(b)
    lengths = (
        torch.full((batch,), seq_length, dtype=torch.int64, device=x.device)
        if sequence_lens is None
        else sequence_lens.to(device=x.device, dtype=torch.int64)
    )
    functions = _activations(activations, default_activations, activation_alpha, activation_beta, num_directions)
    steps = torch.arange(seq_length, device=x.device).unsqueeze(1)  # [seq, 1]
    valid = steps < lengths  # [seq, batch]
    ys, finals = [], []
    for d in range(num_directions):
        reverse = direction == "reverse" or d == 1
        # step s of batch entry b reads time lengths[b] - 1 - s when reversed (a permutation of [0, seq))
        order = torch.where(valid, lengths - 1 - steps, steps) if reverse else steps.expand(seq_length, batch)
        index = order.unsqueeze(-1)
        xd = x.gather(0, index.expand(-1, -1, x.shape[-1]))
        x_gates = xd @ w[d].T + b[d, : num_gates * hidden]
        states = tuple(x.new_zeros((batch, hidden)) if s is None else upcast(s[d]).to(x.dtype) for s in initial_states)
        recurrent_bias = b[d, num_gates * hidden :]
        peepholes = None if extra is None else upcast(extra[d])
        outputs = []
        for step in range(seq_length):
            new = cell(x_gates[step], states, r[d], recurrent_bias, functions[d], clip, peepholes)
            keep = valid[step].unsqueeze(-1)
            states = tuple(torch.where(keep, n, s) for n, s in zip(new, states, strict=True))
            outputs.append(torch.where(keep, states[0], 0.0))
        y = torch.stack(outputs) if outputs else x.new_zeros((0, batch, hidden))
        ys.append(y.gather(0, index.expand(-1, -1, hidden)))
        finals.append(states)
    y = torch.stack(ys, dim=1).to(dtype)  # [seq, num_directions, batch, hidden]
    final = [torch.stack(group).to(dtype) for group in zip(*finals, strict=True)]
    if layout:
        y = y.permute(2, 0, 1, 3)
        final = [s.transpose(0, 1) for s in final]
    return (y if ctx.output_present(0) else None, *final)


def _clip(x: torch.Tensor, clip: float | None) -> torch.Tensor:
    return x if clip is None else x.clamp(-clip, clip)


def _rnn_cell(x_gates, states, r, rb, functions, clip, extra):
    """H = f(X·Wᵀ + H·Rᵀ + Wb + Rb)."""
    (h,) = states
    return (functions[0](_clip(x_gates + h @ r.T + rb, clip)),)


def _gru_cell(linear_before_reset: int) -> Cell:
    """z, r = f(X·Wᵀ + H·Rᵀ + b); h̃ = g(X·Whᵀ + (r⊙H)·Rhᵀ + Rbh + Wbh), or with `linear_before_reset`
    g(X·Whᵀ + r⊙(H·Rhᵀ + Rbh) + Wbh); H' = (1 - z)⊙h̃ + z⊙H. Gate order z, r, h."""

    def cell(x_gates, states, r, rb, functions, clip, extra):
        (h,) = states
        f, g = functions
        xz, xr, xh = x_gates.chunk(3, dim=-1)
        rz, rr, rh = r.chunk(3, dim=0)
        bz, br, bh = rb.chunk(3, dim=-1)
        z = f(_clip(xz + h @ rz.T + bz, clip))
        reset = f(_clip(xr + h @ rr.T + br, clip))
        if linear_before_reset:
            candidate = g(_clip(xh + reset * (h @ rh.T + bh), clip))
        else:
            candidate = g(_clip(xh + (reset * h) @ rh.T + bh, clip))
        return ((1 - z) * candidate + z * h,)

    return cell


def _lstm_cell(input_forget: int) -> Cell:
    """Gates i, o, f, c (in that order in W, R, B) with peepholes P = (Pi, Po, Pf):
    i = f(X·Wiᵀ + H·Riᵀ + Pi⊙C + b), f likewise (or 1 - i with `input_forget`), c̃ = g(...),
    C' = f⊙C + i⊙c̃, o = f(X·Woᵀ + H·Roᵀ + Po⊙C' + b), H' = o⊙h(C')."""

    def cell(x_gates, states, r, rb, functions, clip, extra):
        h, c = states
        f, g, act_h = functions
        gates = x_gates + h @ r.T + rb
        gi, go, gf, gc = gates.chunk(4, dim=-1)
        pi, po, pf = (0.0, 0.0, 0.0) if extra is None else extra.chunk(3, dim=-1)
        i = f(_clip(gi + pi * c, clip))
        forget = 1 - i if input_forget else f(_clip(gf + pf * c, clip))
        c_new = forget * c + i * g(_clip(gc, clip))
        o = f(_clip(go + po * c_new, clip))
        return o * act_h(c_new), c_new

    return cell


# The versioned signatures below list every attribute of their opset; black-style formatting would
# spread each over a screen, so this block keeps them packed.
# fmt: off
@register("RNN", since=14)
def rnn(
    ctx: OpContext, X, W, R, B=None, sequence_lens=None, initial_h=None, *,
    activation_alpha=None, activation_beta=None, activations=None, clip=None,
    direction="forward", hidden_size=None, layout=0,
):
    return _recurrent(
        ctx, _rnn_cell, 1, ["Tanh"], X, W, R, B, sequence_lens, [initial_h], None,
        activation_alpha=activation_alpha, activation_beta=activation_beta, activations=activations,
        clip=clip, direction=direction, hidden_size=hidden_size, layout=layout,
    )


@register("RNN", since=7)
def rnn7(
    ctx: OpContext, X, W, R, B=None, sequence_lens=None, initial_h=None, *,
    activation_alpha=None, activation_beta=None, activations=None, clip=None,
    direction="forward", hidden_size=None,
):
    """RNN before the `layout` attribute (always sequence-first)."""
    return rnn(
        ctx, X, W, R, B, sequence_lens, initial_h, activation_alpha=activation_alpha,
        activation_beta=activation_beta, activations=activations, clip=clip, direction=direction,
        hidden_size=hidden_size,
    )


@register("RNN", since=1)
def rnn1(
    ctx: OpContext, X, W, R, B=None, sequence_lens=None, initial_h=None, *,
    activation_alpha=None, activation_beta=None, activations=None, clip=None,
    direction="forward", hidden_size=None, output_sequence=0,
):
    """RNN-1: `output_sequence` only says whether Y may be omitted; Y is produced when requested."""
    return rnn7(
        ctx, X, W, R, B, sequence_lens, initial_h, activation_alpha=activation_alpha,
        activation_beta=activation_beta, activations=activations, clip=clip, direction=direction,
        hidden_size=hidden_size,
    )


@register("GRU", since=14)
def gru(
    ctx: OpContext, X, W, R, B=None, sequence_lens=None, initial_h=None, *,
    activation_alpha=None, activation_beta=None, activations=None, clip=None,
    direction="forward", hidden_size=None, layout=0, linear_before_reset=0,
):
    return _recurrent(
        ctx, _gru_cell(linear_before_reset), 3, ["Sigmoid", "Tanh"], X, W, R, B, sequence_lens,
        [initial_h], None, activation_alpha=activation_alpha, activation_beta=activation_beta,
        activations=activations, clip=clip, direction=direction, hidden_size=hidden_size, layout=layout,
    )


@register("GRU", since=7)
def gru7(
    ctx: OpContext, X, W, R, B=None, sequence_lens=None, initial_h=None, *,
    activation_alpha=None, activation_beta=None, activations=None, clip=None,
    direction="forward", hidden_size=None, linear_before_reset=0,
):
    """GRU before the `layout` attribute (always sequence-first)."""
    return gru(
        ctx, X, W, R, B, sequence_lens, initial_h, activation_alpha=activation_alpha,
        activation_beta=activation_beta, activations=activations, clip=clip, direction=direction,
        hidden_size=hidden_size, linear_before_reset=linear_before_reset,
    )


@register("GRU", since=3)
def gru3(
    ctx: OpContext, X, W, R, B=None, sequence_lens=None, initial_h=None, *,
    activation_alpha=None, activation_beta=None, activations=None, clip=None,
    direction="forward", hidden_size=None, linear_before_reset=0, output_sequence=0,
):
    """GRU-3: `output_sequence` only says whether Y may be omitted; Y is produced when requested."""
    return gru7(
        ctx, X, W, R, B, sequence_lens, initial_h, activation_alpha=activation_alpha,
        activation_beta=activation_beta, activations=activations, clip=clip, direction=direction,
        hidden_size=hidden_size, linear_before_reset=linear_before_reset,
    )


@register("GRU", since=1)
def gru1(
    ctx: OpContext, X, W, R, B=None, sequence_lens=None, initial_h=None, *,
    activation_alpha=None, activation_beta=None, activations=None, clip=None,
    direction="forward", hidden_size=None, output_sequence=0,
):
    """GRU-1 has no `linear_before_reset` (the reset gate applies before the recurrence)."""
    return gru7(
        ctx, X, W, R, B, sequence_lens, initial_h, activation_alpha=activation_alpha,
        activation_beta=activation_beta, activations=activations, clip=clip, direction=direction,
        hidden_size=hidden_size,
    )


@register("LSTM", since=14)
def lstm(
    ctx: OpContext, X, W, R, B=None, sequence_lens=None, initial_h=None, initial_c=None, P=None, *,
    activation_alpha=None, activation_beta=None, activations=None, clip=None,
    direction="forward", hidden_size=None, input_forget=0, layout=0,
):
    return _recurrent(
        ctx, _lstm_cell(input_forget), 4, ["Sigmoid", "Tanh", "Tanh"], X, W, R, B, sequence_lens,
        [initial_h, initial_c], P, activation_alpha=activation_alpha, activation_beta=activation_beta,
        activations=activations, clip=clip, direction=direction, hidden_size=hidden_size, layout=layout,
    )


@register("LSTM", since=7)
def lstm7(
    ctx: OpContext, X, W, R, B=None, sequence_lens=None, initial_h=None, initial_c=None, P=None, *,
    activation_alpha=None, activation_beta=None, activations=None, clip=None,
    direction="forward", hidden_size=None, input_forget=0,
):
    """LSTM before the `layout` attribute (always sequence-first)."""
    return lstm(
        ctx, X, W, R, B, sequence_lens, initial_h, initial_c, P, activation_alpha=activation_alpha,
        activation_beta=activation_beta, activations=activations, clip=clip, direction=direction,
        hidden_size=hidden_size, input_forget=input_forget,
    )


@register("LSTM", since=1)
def lstm1(
    ctx: OpContext, X, W, R, B=None, sequence_lens=None, initial_h=None, initial_c=None, P=None, *,
    activation_alpha=None, activation_beta=None, activations=None, clip=None,
    direction="forward", hidden_size=None, input_forget=0, output_sequence=0,
):
    """LSTM-1: `output_sequence` only says whether Y may be omitted; Y is produced when requested."""
    return lstm7(
        ctx, X, W, R, B, sequence_lens, initial_h, initial_c, P, activation_alpha=activation_alpha,
        activation_beta=activation_beta, activations=activations, clip=clip, direction=direction,
        hidden_size=hidden_size, input_forget=input_forget,
    )
# fmt: on
