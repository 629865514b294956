"""Every ONNX node-test case of an in-scope op passes, or is a documented exclusion."""

import pytest

from tensorforge.conformance import IN_SCOPE_OPS, load_cases, op_under_test, run_case
from tests.helpers import DEVICES

CASES = [case for case in load_cases() if op_under_test(case) in IN_SCOPE_OPS]


def test_the_in_scope_cases_are_found():
    assert len(CASES) > 700
    assert {op_under_test(c) for c in CASES} == IN_SCOPE_OPS


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_node_case(case, device):
    result = run_case(case, device.upper())
    if result.status == "skipped":
        pytest.skip(result.detail)
    assert result.status == "passed", result.detail
