"""The host side of the Gluon kernel checked on the CPU: its launches recorded instead of run, and what a recorded
boxed launch computes, assembled from its descriptors the way its producer loads."""

import torch

from tests.helpers import RecordedLaunches


def recorded_launches(monkeypatch) -> RecordedLaunches:
    """`kernels.gluon.gemm`'s kernel replaced by a recorder, on a device of 132 multiprocessors."""
    from tensorforge.kernels.gluon import gemm

    recorded = RecordedLaunches()
    monkeypatch.setattr(gemm, "gemm_ws_kernel", recorded)
    monkeypatch.setattr(gemm, "_multiprocessors", lambda index: 132)
    return recorded


def geometry(args) -> tuple:
    """(num_m, N, k_steps, c_steps, C, boxes_h, boxes_w, PH, PW, DH, DW) of a recorded launch."""
    return tuple(args[6:17])


def producer_reads(args, options) -> torch.Tensor:
    """What a recorded boxed launch computes, assembled on the CPU the way its producer loads: for each tap, the
    box of the input (or, at stride 2, of the phase the kernel's own `_phase` picks) shifted by the tap, zeros off
    its edges, times the tap's columns of the packed weight; the sums in float64, [N, OH, OW, C_out]."""
    from tensorforge.kernels.gluon import gemm

    stride = options["STRIDE"]
    phases = [args[0], *args[23:26]] if stride == 2 else [args[0]]
    sources = [torch.as_strided(d.base, d.shape, d.strides).double() for d in phases]
    weight = args[1].base.double()
    _, _, k_steps, c_steps, channels, _, _, ph, pw, dh, dw = geometry(args)
    kw = options["KW"]
    n, oh, ow, _ = args[3].shape
    margin = oh + ow + 8  # past any shift: what lies there reads as zeros, as TMA reads off a tensor's edges
    out = torch.zeros(n, oh, ow, weight.shape[0], dtype=torch.float64)
    for tap in range(k_steps // c_steps):
        row, column = tap // kw * dh - ph, tap % kw * dw - pw
        if stride == 2:
            row_phase, row = gemm._phase.fn(row, ph, stride)
            column_phase, column = gemm._phase.fn(column, pw, stride)
            source = sources[row_phase * 2 + column_phase]
        else:
            source = sources[0]
        padded = torch.nn.functional.pad(source, (0, 0, margin, margin, margin, margin))
        box = padded[:, margin + row : margin + row + oh, margin + column : margin + column + ow]
        out += box @ weight[:, tap * channels : (tap + 1) * channels].T
    return out
