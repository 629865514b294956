"""ONNX node-test cases that tensorforge deliberately does not pass, each with its reason.

Keys are exact case names or `fnmatch` patterns. A case listed here that starts passing is reported so
that its entry can be removed.
"""

from __future__ import annotations

from fnmatch import fnmatchcase

EXCLUSIONS: dict[str, str] = {}


def exclusion_reason(case_name: str) -> str | None:
    reason = EXCLUSIONS.get(case_name)
    if reason is not None:
        return reason
    for pattern, why in EXCLUSIONS.items():
        if any(ch in pattern for ch in "*?[") and fnmatchcase(case_name, pattern):
            return why
    return None
