"""The CPU inference thread: one thread runs every call, hands back results and exceptions, and takes its own."""

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from tensorforge.runtime.cpu_thread import NAME, on_cpu_thread


def _name() -> str:
    return threading.current_thread().name


def test_calls_from_any_thread_run_on_one_thread_and_return_their_results():
    with ThreadPoolExecutor(4) as pool:
        names = list(pool.map(lambda _: on_cpu_thread(_name), range(8)))
    assert len(set(names)) == 1 and names[0].startswith(NAME) and names[0] != _name()
    assert on_cpu_thread(lambda a, b: a * b, 6, 7) == 42


def test_an_exception_reaches_the_caller():
    def broken():
        raise ValueError("the batch failed")

    with pytest.raises(ValueError, match="the batch failed"):
        on_cpu_thread(broken)


def test_a_call_from_the_cpu_thread_runs_in_place():
    assert on_cpu_thread(lambda: on_cpu_thread(_name)).startswith(NAME)  # no deadlock waiting on itself
