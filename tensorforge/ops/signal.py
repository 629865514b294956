"""Signal processing: DFT, STFT, the Hann/Hamming/Blackman windows and MelWeightMatrix.

Signals hold real values as a trailing dimension of 1 and complex ones as a trailing dimension of 2
(real, imaginary); spectra are always complex. Half-precision inputs are transformed in float32.
"""

from __future__ import annotations

import math

import torch

from .helpers import to_dtype, upcast
from .registry import OpContext, register


def _to_complex(x: torch.Tensor) -> torch.Tensor:
    """A complex tensor from a [..., 1] (real) or [..., 2] (real, imaginary) float tensor."""
    if x.shape[-1] == 1:
        return torch.complex(x[..., 0], torch.zeros_like(x[..., 0]))
    if x.shape[-1] == 2:
        return torch.complex(x[..., 0], x[..., 1])
    raise ValueError(f"the last dimension must be 1 (real) or 2 (complex), not {x.shape[-1]}")


def _dft(x: torch.Tensor, length: int | None, axis: int, inverse: int, onesided: int) -> torch.Tensor:
    """DFT of `x` along `axis` (counted over the rank including the real/complex dimension).

    `length` zero-pads or truncates the signal. `onesided` keeps bins 0..n//2 of a forward transform
    (RFFT); with `inverse` it reads such a half spectrum and returns the real signal of length `length`
    (default 2 * (bins - 1), IRFFT) as [..., 1].
    """
    rank = x.dim()
    if not (-rank <= axis <= -2 or 0 <= axis <= rank - 2):
        raise ValueError(f"DFT axis {axis} is out of range for rank {rank}")
    axis %= rank
    dtype = x.dtype
    x = upcast(x)
    if onesided and inverse:
        signal = torch.fft.irfft(_to_complex(x), n=length, dim=axis)
        return signal.unsqueeze(-1).to(dtype)
    if onesided and x.shape[-1] == 1:
        spectrum = torch.fft.rfft(x[..., 0], n=length, dim=axis)
    else:
        transform = torch.fft.ifft if inverse else torch.fft.fft
        spectrum = transform(_to_complex(x), n=length, dim=axis)
        if onesided:
            spectrum = spectrum.narrow(axis, 0, spectrum.shape[axis] // 2 + 1)
    return torch.view_as_real(spectrum).to(dtype)


def _length(dft_length) -> int | None:
    return None if dft_length is None else int(dft_length)


@register("DFT", since=20)
def dft(ctx: OpContext, input, dft_length=None, axis=None, *, inverse=0, onesided=0):
    """DFT with the axis as an input (default -2, the last signal axis)."""
    axis = -2 if axis is None else int(axis)
    return _dft(input, _length(dft_length), axis, inverse, onesided)


@register("DFT", since=17)
def dft17(ctx: OpContext, input, dft_length=None, *, axis=1, inverse=0, onesided=0):
    """DFT with the axis as an attribute (default 1, the first axis after the batch)."""
    return _dft(input, _length(dft_length), axis, inverse, onesided)


@register("STFT", since=17)
def stft(ctx: OpContext, signal, frame_step, window=None, frame_length=None, *, onesided=1):
    """Short-time Fourier transform of a [batch, length, 1|2] signal: frames of `frame_length` samples
    every `frame_step`, each multiplied by `window` (default all ones) and transformed. Output is
    [batch, frames, bins, 2] with frames = (length - frame_length) // frame_step + 1 and bins =
    frame_length // 2 + 1 when `onesided` (real signal and window only), else frame_length."""
    if frame_length is not None:
        size = int(frame_length)
    else:
        size = signal.shape[1] if window is None else window.shape[0]
    if window is not None and window.shape[0] != size:
        raise ValueError(f"window length {window.shape[0]} differs from frame_length {size}")
    dtype = signal.dtype
    frames = upcast(signal).unfold(1, size, int(frame_step)).movedim(-1, 2)  # [batch, frames, size, 1|2]
    if window is None:
        window = torch.ones(size, dtype=frames.dtype, device=frames.device)
    window = upcast(window)
    if window.dim() == 2:  # a complex window [size, 2]
        window = _to_complex(window)
    real = frames.shape[-1] == 1 and not window.is_complex()
    if onesided and not real:
        raise ValueError("STFT onesided=1 needs a real signal and a real window")
    if real:
        windowed = frames[..., 0] * window
        spectrum = torch.fft.rfft(windowed, dim=2) if onesided else torch.fft.fft(windowed, dim=2)
    else:
        spectrum = torch.fft.fft(_to_complex(frames) * window, dim=2)
    return torch.view_as_real(spectrum).to(dtype)


def _cosine_window(
    ctx: OpContext, size, coefficients: tuple[float, ...], periodic: int, output_datatype: int
) -> torch.Tensor:
    """w[n] = sum_k (-1)^k a_k cos(2πkn / N) for n in [0, size), N = size if `periodic` else size - 1;
    computed in float64 and cast to `output_datatype`."""
    count = int(size)
    period = count if periodic else count - 1
    n = torch.arange(count, dtype=torch.float64, device=ctx.device)
    window = torch.zeros_like(n)
    for k, a in enumerate(coefficients):
        window += (-1) ** k * a * torch.cos(2 * math.pi * k * n / period)
    return window.to(to_dtype(output_datatype))


@register("HannWindow", since=17)
def hann_window(ctx: OpContext, size, *, output_datatype=1, periodic=1):
    return _cosine_window(ctx, size, (0.5, 0.5), periodic, output_datatype)


@register("HammingWindow", since=17)
def hamming_window(ctx: OpContext, size, *, output_datatype=1, periodic=1):
    """Hamming window with a0 = 25/46, a1 = 21/46."""
    return _cosine_window(ctx, size, (25 / 46, 21 / 46), periodic, output_datatype)


@register("BlackmanWindow", since=17)
def blackman_window(ctx: OpContext, size, *, output_datatype=1, periodic=1):
    return _cosine_window(ctx, size, (0.42, 0.5, 0.08), periodic, output_datatype)


@register("MelWeightMatrix", since=17)
def mel_weight_matrix(
    ctx: OpContext, num_mel_bins, dft_length, sample_rate, lower_edge_hertz, upper_edge_hertz, *,
    output_datatype=1,
):  # fmt: skip
    """A [dft_length // 2 + 1, num_mel_bins] matrix of triangular filters with peak 1.

    mel(f) = 2595 log10(1 + f / 700). The num_mel_bins + 2 band edges are spaced evenly on the mel scale
    from mel(lower_edge_hertz) in steps of (mel(upper) - mel(lower)) / (num_mel_bins + 2) and mapped to
    spectrogram bins floor((dft_length + 1) * f / sample_rate). Filter i rises linearly from edge i to
    edge i + 1 and falls to edge i + 2.
    """
    bins, length, rate = int(num_mel_bins), int(dft_length), int(sample_rate)
    low = 2595 * math.log10(1 + float(lower_edge_hertz) / 700)
    high = 2595 * math.log10(1 + float(upper_edge_hertz) / 700)
    step = (high - low) / (bins + 2)
    mels = torch.arange(bins + 2, dtype=torch.float64, device=ctx.device) * step + low
    hertz = 700 * torch.expm1(mels / 2595 * math.log(10))
    edges = torch.floor((length + 1) * hertz / rate)
    left, center, right = edges[:-2], edges[1:-1], edges[2:]
    j = torch.arange(length // 2 + 1, dtype=torch.float64, device=ctx.device).unsqueeze(1)  # [spectrogram bins, 1]
    rising = (j - left) / (center - left).clamp(min=1)
    falling = (right - j) / (right - center).clamp(min=1)
    weights = torch.where((left <= j) & (j <= center), rising, 0.0)
    weights = torch.where((center <= j) & (j < right), falling, weights)
    weights = torch.where((center == left) & (j == center), 1.0, weights)
    return weights.to(to_dtype(output_datatype))
