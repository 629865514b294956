"""What a build decided, as stored in the engine header: per optimization profile, the tactic of every layer
and the memory plan."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..build.config import Profile
from ..build.memory import MemoryPlan
from ..tactics.autotune import Candidate


@dataclass(frozen=True)
class Layer:
    """The implementation chosen for one node of the engine's graph (by its position in `graph.nodes`)."""

    node: int
    tactic: str
    config: dict[str, Any]
    median_ms: float
    candidates: tuple[Candidate, ...] = ()
    from_cache: bool = False

    @property
    def precision(self) -> str:
        return self.config.get("precision", "fp32")

    @property
    def layout(self) -> str:
        return self.config.get("layout", "any")

    def to_dict(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "tactic": self.tactic,
            "config": self.config,
            "median_ms": self.median_ms,
            "from_cache": self.from_cache,
            "candidates": [c.to_dict() for c in self.candidates],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Layer:
        return cls(
            node=int(data["node"]),
            tactic=str(data["tactic"]),
            config=dict(data["config"]),
            median_ms=float(data["median_ms"]),
            candidates=tuple(Candidate.from_dict(c) for c in data.get("candidates", ())),
            from_cache=bool(data.get("from_cache", False)),
        )


@dataclass(frozen=True)
class Plan:
    """The build for one optimization profile: layers tuned at its opt shapes, memory planned at its max."""

    profile: Profile
    layers: tuple[Layer, ...]
    memory: MemoryPlan
    tuned_shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)

    @property
    def total_ms(self) -> float:
        return sum(layer.median_ms for layer in self.layers)

    def to_dict(self) -> dict[str, Any]:
        return {
            "profile": self.profile.to_dict(),
            "tuned_shapes": {name: list(shape) for name, shape in self.tuned_shapes.items()},
            "layers": [layer.to_dict() for layer in self.layers],
            "memory": self.memory.to_dict(),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Plan:
        return cls(
            profile=Profile.from_dict(data["profile"]),
            layers=tuple(Layer.from_dict(layer) for layer in data["layers"]),
            memory=MemoryPlan.from_dict(data["memory"]),
            tuned_shapes={name: tuple(shape) for name, shape in data.get("tuned_shapes", {}).items()},
        )
