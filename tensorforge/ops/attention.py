"""Scaled dot-product Attention (opsets 23-25) and RotaryEmbedding.

Attention works on [batch, heads, seq, head_size] tensors (3-D inputs are split into heads first) in the
inputs' precision. The additive bias sums the attention mask (a bool mask gives 0 / -inf), the causal
frontier, the sliding window and the `nonpad_kv_seqlen` padding; causal and window masks are aligned
bottom-right by the cache offset (past length, or `nonpad_kv_seqlen - q_len` per batch). A query row whose
bias is entirely -inf attends nothing and yields zeros.
"""

from __future__ import annotations

import math

import torch

from ..ir import DType
from .registry import OpContext, register

_QK_RAW, _QK_SOFTCAP, _QK_BIAS, _QK_SOFTMAX = range(4)


def _split_heads(x: torch.Tensor, heads: int) -> torch.Tensor:
    """[batch, seq, heads * size] -> [batch, heads, seq, size]."""
    batch, seq, hidden = x.shape
    return x.reshape(batch, seq, heads, hidden // heads).transpose(1, 2)


def _softmax(x: torch.Tensor) -> torch.Tensor:
    """Softmax over the last axis; an all -inf row gives zeros instead of NaN."""
    peak = x.amax(-1, keepdim=True)
    peak = torch.where(torch.isneginf(peak), 0.0, peak)
    exp = torch.exp(x - peak)
    total = exp.sum(-1, keepdim=True)
    return exp / torch.where(total == 0, 1.0, total)


def _allowed_bias(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return torch.where(allowed, 0.0, float("-inf")).to(dtype)


def _frontier(offset: torch.Tensor, q_len: int, kv_len: int) -> torch.Tensor:
    """`(query position + offset) - key position` as [q, kv], or [batch, 1, q, kv] for per-batch offsets."""
    device = offset.device
    diff = torch.arange(q_len, device=device)[:, None] - torch.arange(kv_len, device=device)
    return diff + offset.reshape(-1, 1, 1, 1) if offset.dim() else diff + offset


def _bias(
    q: torch.Tensor,
    kv_len: int,
    attn_mask: torch.Tensor | None,
    offset: torch.Tensor,
    nonpad_kv_seqlen: torch.Tensor | None,
    is_causal: bool,
    window: tuple[int, int],
) -> torch.Tensor:
    q_len, dtype = q.shape[2], q.dtype
    bias = torch.zeros((q_len, kv_len), dtype=dtype, device=q.device)
    if attn_mask is not None:
        pad = kv_len - attn_mask.shape[-1]
        if attn_mask.dtype == torch.bool:
            mask = _allowed_bias(torch.nn.functional.pad(attn_mask, (0, pad), value=False), dtype)
        else:
            mask = torch.nn.functional.pad(attn_mask.to(dtype), (0, pad), value=float("-inf"))
        bias = bias + mask
    diff = _frontier(offset, q_len, kv_len)
    if is_causal:
        bias = bias + _allowed_bias(diff >= 0, dtype)
    left, right = window
    if left >= 0 or right >= 0:
        inside = torch.ones_like(diff, dtype=torch.bool)
        if left >= 0:
            inside &= diff <= left
        if right >= 0:
            inside &= -diff <= right
        bias = bias + _allowed_bias(inside, dtype)
    if nonpad_kv_seqlen is not None:
        valid = torch.arange(kv_len, device=q.device) < nonpad_kv_seqlen.reshape(-1, 1, 1, 1)
        bias = bias + _allowed_bias(valid, dtype)
    return bias


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    past_key: torch.Tensor | None = None,
    past_value: torch.Tensor | None = None,
    nonpad_kv_seqlen: torch.Tensor | None = None,
    *,
    is_causal: bool = False,
    q_num_heads: int | None = None,
    kv_num_heads: int | None = None,
    qk_matmul_output_mode: int = 0,
    scale: float | None = None,
    softcap: float = 0.0,
    softmax_precision: int | None = None,
    window: tuple[int, int] = (-1, -1),
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Y, present_key, present_value and qk_matmul_output of the ONNX Attention op."""
    if (past_key is None) != (past_value is None):
        raise ValueError("past_key and past_value must be given together")
    if past_key is not None and nonpad_kv_seqlen is not None:
        raise ValueError("nonpad_kv_seqlen cannot be combined with past_key/past_value")
    three_d = q.dim() == 3
    if three_d:
        if not q_num_heads or not kv_num_heads:
            raise ValueError("3-D inputs need q_num_heads and kv_num_heads")
        q, k, v = _split_heads(q, q_num_heads), _split_heads(k, kv_num_heads), _split_heads(v, kv_num_heads)
    if past_key is not None:
        k, v = torch.cat([past_key, k], dim=2), torch.cat([past_value, v], dim=2)
    present_key, present_value = k, v
    q_len, kv_len = q.shape[2], k.shape[2]
    if past_key is not None:
        offset = torch.full((), past_key.shape[2], dtype=torch.int64, device=q.device)
    elif nonpad_kv_seqlen is not None:
        offset = nonpad_kv_seqlen.reshape(-1) - q_len
    else:
        offset = torch.zeros((), dtype=torch.int64, device=q.device)
    bias = _bias(q, kv_len, attn_mask, offset, nonpad_kv_seqlen, is_causal, window)

    if q.shape[1] != k.shape[1]:
        if q.shape[1] % k.shape[1]:
            raise ValueError(f"{q.shape[1]} query heads are not a multiple of {k.shape[1]} kv heads")
        repeats = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(repeats, dim=1), v.repeat_interleave(repeats, dim=1)
    root = torch.full(
        (), math.sqrt(scale if scale is not None else 1 / math.sqrt(q.shape[-1])), dtype=q.dtype, device=q.device
    )
    raw = (q * root) @ (k * root).transpose(-1, -2)
    capped = softcap * torch.tanh(raw / softcap) if softcap > 0 else raw
    scores = capped + bias
    softmax_dtype = DType(softmax_precision).torch if softmax_precision else q.dtype
    probs = _softmax(scores.to(softmax_dtype))
    probs = torch.where(torch.isneginf(bias.amax(-1, keepdim=True)), 0.0, probs)
    y = probs.to(q.dtype) @ v
    if three_d:
        y = y.transpose(1, 2).reshape(y.shape[0], q_len, -1)
    qk_output = (raw, capped, scores, probs)[qk_matmul_output_mode].to(q.dtype)
    return y, present_key, present_value, qk_output


def _outputs(ctx: OpContext, results: tuple) -> tuple:
    return tuple(r if i == 0 or ctx.output_present(i) else None for i, r in enumerate(results))


@register("Attention", since=23)
def attention_23(
    ctx: OpContext,
    q,
    k,
    v,
    attn_mask=None,
    past_key=None,
    past_value=None,
    *,
    is_causal=0,
    kv_num_heads=None,
    q_num_heads=None,
    qk_matmul_output_mode=0,
    scale=None,
    softcap=0.0,
    softmax_precision=None,
):
    return attention_24(
        ctx,
        q,
        k,
        v,
        attn_mask,
        past_key,
        past_value,
        is_causal=is_causal,
        kv_num_heads=kv_num_heads,
        q_num_heads=q_num_heads,
        qk_matmul_output_mode=qk_matmul_output_mode,
        scale=scale,
        softcap=softcap,
        softmax_precision=softmax_precision,
    )


@register("Attention", since=24)
def attention_24(
    ctx: OpContext,
    q,
    k,
    v,
    attn_mask=None,
    past_key=None,
    past_value=None,
    nonpad_kv_seqlen=None,
    *,
    is_causal=0,
    kv_num_heads=None,
    q_num_heads=None,
    qk_matmul_output_mode=0,
    scale=None,
    softcap=0.0,
    softmax_precision=None,
):
    """Adds `nonpad_kv_seqlen`: an external cache whose first n keys per batch are valid."""
    results = attention(
        q,
        k,
        v,
        attn_mask,
        past_key,
        past_value,
        nonpad_kv_seqlen,
        is_causal=bool(is_causal),
        q_num_heads=q_num_heads,
        kv_num_heads=kv_num_heads,
        qk_matmul_output_mode=qk_matmul_output_mode,
        scale=scale,
        softcap=softcap,
        softmax_precision=softmax_precision,
    )
    return _outputs(ctx, results)


@register("Attention", since=25)
def attention_25(
    ctx: OpContext,
    q,
    k,
    v,
    attn_mask=None,
    past_key=None,
    past_value=None,
    nonpad_kv_seqlen=None,
    *,
    is_causal=0,
    kv_num_heads=None,
    q_num_heads=None,
    qk_matmul_output_mode=0,
    scale=None,
    softcap=0.0,
    softmax_precision=None,
    left_window_size=-1,
    right_window_size=-1,
):
    """Adds sliding windows: query position p attends keys in [p - left, p + right] (-1: unbounded)."""
    if q.dim() == 4 and (q_num_heads is not None or kv_num_heads is not None):
        raise ValueError("q_num_heads and kv_num_heads must not be given for 4-D inputs")
    if left_window_size < -1 or right_window_size < -1:
        raise ValueError("window sizes must be -1 or nonnegative")
    results = attention(
        q,
        k,
        v,
        attn_mask,
        past_key,
        past_value,
        nonpad_kv_seqlen,
        is_causal=bool(is_causal),
        q_num_heads=q_num_heads,
        kv_num_heads=kv_num_heads,
        qk_matmul_output_mode=qk_matmul_output_mode,
        scale=scale,
        softcap=softcap,
        softmax_precision=softmax_precision,
        window=(left_window_size, right_window_size),
    )
    return _outputs(ctx, results)


@register("RotaryEmbedding", since=23)
def rotary_embedding(
    ctx: OpContext,
    x,
    cos_cache,
    sin_cache,
    position_ids=None,
    *,
    interleaved=0,
    num_heads=0,
    rotary_embedding_dim=0,
):
    """Rotate pairs of each head's first `rotary_embedding_dim` features (halves, or even/odd pairs when
    `interleaved`) by the cached angles of each position. `x` is [batch, heads, seq, size] or
    [batch, seq, hidden] (split into `num_heads`); caches are [max_pos, dim/2] with `position_ids`
    [batch, seq], or [batch, seq, dim/2] without."""
    shape = x.shape
    if x.dim() == 4:
        x = x.transpose(1, 2)
    else:
        if not num_heads:
            raise ValueError("3-D input needs num_heads")
        x = x.reshape(shape[0], shape[1], num_heads, shape[2] // num_heads)
    dim = rotary_embedding_dim or x.shape[-1]
    rotate, keep = x[..., :dim], x[..., dim:]
    if position_ids is not None:
        cos_cache, sin_cache = cos_cache[position_ids], sin_cache[position_ids]
    if cos_cache.shape[-1] != dim // 2 or sin_cache.shape[-1] != dim // 2:
        raise ValueError(f"cos/sin caches must have {dim // 2} features, got {cos_cache.shape[-1]}")
    cos, sin = cos_cache.unsqueeze(2), sin_cache.unsqueeze(2)
    if interleaved:
        x1, x2 = rotate[..., 0::2], rotate[..., 1::2]
    else:
        x1, x2 = rotate.chunk(2, dim=-1)
    real, imag = cos * x1 - sin * x2, sin * x1 + cos * x2
    if interleaved:
        rotated = torch.stack([real, imag], dim=-1).reshape(rotate.shape)
    else:
        rotated = torch.cat([real, imag], dim=-1)
    out = torch.cat([rotated, keep], dim=-1)
    return out.reshape(shape) if len(shape) == 3 else out.transpose(1, 2)


_UPDATE_RULES = ("linear", "gated", "delta", "gated_delta")


def _per_head(x: torch.Tensor, heads: int) -> torch.Tensor:
    """A gate [batch, seq, heads * n] (n >= 1) as [batch, heads, seq, n]."""
    batch, seq, width = x.shape
    return x.reshape(batch, seq, heads, width // heads).transpose(1, 2)


@register("LinearAttention", since=27)
def linear_attention(
    ctx: OpContext,
    query,
    key,
    value,
    past_state=None,
    decay=None,
    beta=None,
    *,
    chunk_size=64,
    kv_num_heads=None,
    q_num_heads=None,
    scale=0.0,
    update_rule="gated_delta",
):
    """Recurrent linear attention over a [heads, d_k, d_v] state per batch, token by token:
    gated rules decay the state by exp(decay), delta rules write beta * (v - S^T k) instead of v, every
    rule adds k ⊗ v and reads `scale * q^T S` (KV-head states shared by groups of query heads).
    Computes in float32 (float64 for double inputs); `chunk_size` is only a tuning hint."""
    if update_rule not in _UPDATE_RULES:
        raise ValueError(f"update_rule must be one of {_UPDATE_RULES}, got {update_rule!r}")
    if not q_num_heads or not kv_num_heads or q_num_heads % kv_num_heads:
        raise ValueError("q_num_heads must be a positive multiple of kv_num_heads")
    gated, delta = update_rule in ("gated", "gated_delta"), update_rule in ("delta", "gated_delta")
    if gated != (decay is not None) or delta != (beta is not None):
        raise ValueError(f"update_rule {update_rule!r} needs decay={gated} and beta={delta}")
    compute = torch.promote_types(query.dtype, torch.float32)
    q = _split_heads(query.to(compute), q_num_heads)
    k = _split_heads(key.to(compute), kv_num_heads)
    v = _split_heads(value.to(compute), kv_num_heads)
    batch, _, steps, d_k = k.shape
    d_v = v.shape[-1]
    if past_state is None:
        state = torch.zeros((batch, kv_num_heads, d_k, d_v), dtype=compute, device=q.device)
    else:
        state = past_state.to(compute)
    gate = _per_head(decay.to(compute), kv_num_heads) if gated else None
    rate = _per_head(beta.to(compute), beta.shape[-1]) if delta else None
    group = q_num_heads // kv_num_heads
    factor = scale or 1.0 / math.sqrt(q.shape[-1])
    outputs = []
    for t in range(steps):
        k_t, v_t = k[:, :, t], v[:, :, t]
        if gated:
            state = state * torch.exp(gate[:, :, t]).unsqueeze(-1)
        if delta:
            v_t = rate[:, :, t] * (v_t - torch.einsum("bhdm,bhd->bhm", state, k_t))
        state = state + k_t.unsqueeze(-1) * v_t.unsqueeze(-2)
        read = state.repeat_interleave(group, dim=1) if group > 1 else state
        outputs.append(factor * torch.einsum("bhd,bhdm->bhm", q[:, :, t], read))
    output = torch.stack(outputs, dim=2).transpose(1, 2).reshape(batch, steps, q_num_heads * d_v)
    state_dtype = query.dtype if past_state is None else past_state.dtype
    return output.to(query.dtype), state.to(state_dtype)


def _run_modifier(ctx: OpContext, graph, x: torch.Tensor) -> torch.Tensor:
    (result,) = ctx.run_subgraph(graph, [x])
    return result.to(x.dtype)


@register("FlexAttention", since=1, domain="ai.onnx.preview")
def flex_attention(ctx: OpContext, q, k, v, *, scale=None, score_mod=None, prob_mod=None, softmax_precision=None):
    """`softmax(score_mod(scale * Q K^T)) -> prob_mod -> @ V` on rank-4 inputs, with GQA. Scores,
    probabilities and the final matmul use `softmax_precision` (float32, or float64 for double inputs)."""
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError("FlexAttention needs rank-4 Q, K and V")
    if q.shape[1] != k.shape[1]:
        if q.shape[1] % k.shape[1]:
            raise ValueError(f"{q.shape[1]} query heads are not a multiple of {k.shape[1]} kv heads")
        repeats = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(repeats, dim=1), v.repeat_interleave(repeats, dim=1)
    if softmax_precision:
        compute = DType(softmax_precision).torch
    else:
        compute = torch.promote_types(q.dtype, torch.float32)
    factor = scale if scale is not None else 1.0 / math.sqrt(q.shape[-1])
    root = torch.full((), math.sqrt(factor), dtype=torch.float32, device=q.device).to(q.dtype)
    scores = ((q * root) @ (k * root).transpose(-1, -2)).to(compute)
    if score_mod is not None:
        scores = _run_modifier(ctx, score_mod, scores)
    probs = torch.softmax(scores, dim=-1)
    if prob_mod is not None:
        probs = _run_modifier(ctx, prob_mod, probs)
    return (probs @ v.to(compute)).to(v.dtype)
