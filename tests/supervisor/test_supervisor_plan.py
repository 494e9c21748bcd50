"""Spec sets the supervisor refuses, and the UI-free import contract."""

from __future__ import annotations

import pkgutil
import subprocess
import sys

import pytest
from conftest import spec

import grpo_tui.supervisor
from grpo_tui.supervisor.graph import PlanError, dependents, start_order
from grpo_tui.supervisor.supervisor import Supervisor

CMD = [sys.executable, "-c", "pass"]


def test_start_order_puts_dependencies_first() -> None:
    specs = [
        spec("env", CMD, depends_on={"trainer": {}, "api": {}}),
        spec("trainer", CMD, depends_on={"inference": {}}),
        spec("inference", CMD, depends_on={"api": {}}),
        spec("api", CMD),
    ]
    assert start_order(specs) == ["api", "inference", "trainer", "env"]
    assert dependents(specs, "inference") == ["trainer", "env"]


@pytest.mark.parametrize(
    ("specs", "message"),
    [
        ([spec("a", CMD, depends_on={"b": {}})], "a.depends_on names no process: 'b'"),
        (
            [spec("a", CMD, depends_on={"b": {}}), spec("b", CMD, depends_on={"a": {}})],
            "dependency cycle",
        ),
        ([spec("a", CMD, port=9000), spec("b", CMD, port=9000)], "both use port 9000"),
        ([spec("a", CMD), spec("a", CMD)], "name 'a' is used twice"),
        ([spec("a", CMD, needs=[{"any_of": ["b"]}])], "a.needs names no process: 'b'"),
    ],
)
def test_bad_plans_are_refused_before_anything_starts(specs, message, tmp_path) -> None:
    with pytest.raises(PlanError, match=message):
        Supervisor(specs, tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_exit_with_must_name_a_process(tmp_path) -> None:
    with pytest.raises(PlanError, match="exit_with names no process"):
        Supervisor([spec("a", CMD)], tmp_path, exit_with="trainer")


def test_no_supervisor_module_imports_textual() -> None:
    names = [
        f"grpo_tui.supervisor.{m.name}" for m in pkgutil.iter_modules(grpo_tui.supervisor.__path__)
    ]
    code = (
        "import importlib, sys\n"
        f"for name in {names!r}: importlib.import_module(name)\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'textual'))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
    assert len(names) >= 10
