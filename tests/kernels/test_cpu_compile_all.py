"""`kernels.cpu.compile_all`: every CPU kernel built at once; one that cannot be built does not stop the others."""

from tensorforge.kernels import cpu
from tensorforge.kernels.cpu import depthwise, pointwise, squeeze_excite, stem_conv


def test_every_kernel_is_built_and_a_failure_is_left_to_its_tactic(monkeypatch):
    built = []

    def broken():
        raise RuntimeError("no compiler")

    monkeypatch.setattr(depthwise, "module", broken)
    monkeypatch.setattr(pointwise, "module", lambda: built.append("pointwise"))
    monkeypatch.setattr(squeeze_excite, "module", lambda: built.append("squeeze_excite"))
    monkeypatch.setattr(stem_conv, "module", lambda: built.append("stem_conv"))
    cpu.compile_all()
    assert sorted(built) == ["pointwise", "squeeze_excite", "stem_conv"]
