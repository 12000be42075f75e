"""tests/conftest.py: a variable a test sets, changes or removes without monkeypatch is as it was for the next test."""

from __future__ import annotations

FIXTURE = "from tests.conftest import environment_as_found  # noqa: F401\n"   # the fixture, alone

TESTS = """
import os

def test_a_sets_changes_and_removes():
    os.environ["MISTILL_SET_BY_A_TEST"] = "1"
    os.environ["MISTILL_KEPT"] = "changed"
    del os.environ["MISTILL_REMOVED"]

def test_b_finds_the_environment_as_it_was():
    assert "MISTILL_SET_BY_A_TEST" not in os.environ
    assert os.environ["MISTILL_KEPT"] == "kept"
    assert os.environ["MISTILL_REMOVED"] == "here"
"""


def test_the_next_test_finds_the_environment_as_it_was(pytester, monkeypatch):
    monkeypatch.setenv("MISTILL_KEPT", "kept")
    monkeypatch.setenv("MISTILL_REMOVED", "here")
    pytester.makeconftest(FIXTURE)
    pytester.makepyfile(TESTS)
    pytester.runpytest_inprocess("-p", "no:cacheprovider").assert_outcomes(passed=2)


def test_without_it_the_change_would_reach_the_next_test(pytester, monkeypatch):
    monkeypatch.setenv("MISTILL_KEPT", "kept")
    monkeypatch.setenv("MISTILL_REMOVED", "here")
    pytester.makepyfile(TESTS)
    pytester.runpytest_inprocess("-p", "no:cacheprovider").assert_outcomes(passed=1, failed=1)
