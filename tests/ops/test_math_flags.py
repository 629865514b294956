"""TF32 flags under concurrent runs: one run ending must not switch TF32 back on under another."""

import threading

import torch

from tensorforge.ops.math_flags import full_float32, tf32_math


def _flags():
    return torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32


def test_overlapping_runs_keep_tf32_off_until_the_last_ends():
    before = _flags()
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    try:
        first_in, second_done, first_out = threading.Event(), threading.Event(), threading.Event()
        seen = {}

        def first():
            with full_float32():
                first_in.set()
                second_done.wait(10)  # the second run has left; this one still runs
                seen["first"] = _flags()
            first_out.set()

        thread = threading.Thread(target=first)
        thread.start()
        first_in.wait(10)
        with full_float32():
            seen["second"] = _flags()
            with tf32_math():
                seen["tf32 layer"] = _flags()
            seen["after tf32 layer"] = _flags()
        second_done.set()
        thread.join(10)
        assert seen == {
            "first": (False, False), "second": (False, False),
            "tf32 layer": (True, True), "after tf32 layer": (False, False),
        }  # fmt: skip
        assert _flags() == (True, True)  # the caller's setting is back once no run is left
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before
