"""bench/depthwise_channels.py's simulation: which activations it quantizes per channel, with which scales, and
that this helps where depthwise inputs have channels of very different ranges."""

import numpy as np
import torch

from bench import depthwise_channels as dc
from tensorforge import Executor, from_torch
from tensorforge.passes.pipeline import optimize
from tensorforge.quant import simulate
from tensorforge.quant.calibration import _observing, calibrate


class Separable(torch.nn.Module):
    """A 1x1 convolution whose output channels differ in range by 100x, then a depthwise and a 1x1 one."""

    def __init__(self) -> None:
        super().__init__()
        self.expand = torch.nn.Conv2d(3, 8, 1)
        self.depthwise = torch.nn.Conv2d(8, 8, 3, padding=1, groups=8)
        self.project = torch.nn.Conv2d(8, 4, 1)
        with torch.no_grad():
            self.expand.weight.mul_(torch.logspace(-1, 1, 8).reshape(8, 1, 1, 1))

    def forward(self, x):
        return self.project(self.depthwise(torch.relu(self.expand(x))))


def _run(model, feeds, name):
    """Tensor `name` over the feeds."""
    executor = Executor(_observing(model, [name]), "cpu")
    return np.concatenate([executor.run(feed)[name].numpy() for feed in feeds])


def test_depthwise_inputs_get_per_channel_scales_and_a_smaller_error():
    torch.manual_seed(0)
    module = Separable().eval()
    model, _ = optimize(from_torch(module, torch.randn(2, 3, 8, 8)))
    (name,) = dc.depthwise_inputs(model)
    rng = np.random.default_rng(0)
    feeds = [{"input": rng.standard_normal((2, 3, 8, 8)).astype(np.float32)} for _ in range(4)]
    amax = dc.channel_amax(model, [name], feeds)
    assert amax[name].shape == (8,) and amax[name].max() > 20 * amax[name].min()

    table = calibrate(model, feeds, "minmax")
    per_channel = simulate.simulate_with(model, dc.PerChannelInputs(table, amax))
    quantizers = [n for n in per_channel.graph.nodes if n.op_type == "QuantizeLinear" and n.inputs[0].name == name]
    (quantizer,) = quantizers
    assert quantizer.attributes["axis"] == 1
    torch.testing.assert_close(quantizer.inputs[1].const, amax[name] / 127)

    # The depthwise layer's own output: its input's rounding is all that differs between the two simulations.
    (depthwise,) = [n for n in model.graph.nodes if n.inputs and n.inputs[0].name == name]
    out = depthwise.outputs[0].name
    want = _run(model, feeds, out)
    per_tensor_error = np.abs(_run(simulate.simulate_with(model, simulate.InsertQDQ(table)), feeds, out) - want)
    per_channel_error = np.abs(_run(per_channel, feeds, out) - want)
    small = (amax[name] < amax[name].max() / 10).numpy()  # the channels one per-tensor scale crushes
    assert per_channel_error[:, small].max() < 0.25 * per_tensor_error[:, small].max()
    assert per_channel_error.max() <= per_tensor_error.max() * 1.01
