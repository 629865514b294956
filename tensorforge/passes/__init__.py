"""Graph rewrites: one class per rule (match / check / rewrite), passes, and the pass manager."""

from .base import Event, Pass, PassContext, Rule, RulePass, qualified_op
from .manager import OptimizationReport, PassManager, PassRun, op_histogram

__all__ = [
    "Event",
    "OptimizationReport",
    "Pass",
    "PassContext",
    "PassManager",
    "PassRun",
    "Rule",
    "RulePass",
    "op_histogram",
    "qualified_op",
]
