"""Program-to-tile order shared by the tiled matrix kernels, and how many programs one wave of a device runs."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def swizzle(pid, m_tiles, n_tiles, GROUP_M: tl.constexpr):
    """(row tile, column tile) of program `pid`: GROUP_M row tiles sweep the column tiles together, so the
    programs running at once share B's column tiles (and A's row tiles) in L2."""
    per_group = GROUP_M * n_tiles
    first_m = (pid // per_group) * GROUP_M
    group_rows = tl.minimum(m_tiles - first_m, GROUP_M)
    return first_m + (pid % per_group) % group_rows, (pid % per_group) // group_rows


def wave_slots(device: torch.device) -> int:
    """Programs one wave runs on `device`: its SM count on CUDA; 1 elsewhere (the interpreter runs them in turn)."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 1
