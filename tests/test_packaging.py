"""The two descriptions of the environment (pyproject.toml for pip, environment.yml for conda) must agree."""
from __future__ import annotations

import re
import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def _norm(req: str) -> str:
    name, spec = re.match(r"\s*([A-Za-z0-9_.\-]+)\s*(.*)", req).groups()
    return re.sub(r"[-_.]+", "-", name).lower() + spec.replace(" ", "")


def test_environment_yml_matches_pyproject():
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip_section = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d)
    assert sorted(map(_norm, pip_section)) == sorted(map(_norm, deps))
    assert "python=3.11" in env["dependencies"]


def test_pinned_torch_pair_and_evaluator():
    deps = {_norm(d) for d in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]}
    # Other torch versions download gigabytes here; pycocoevalcap 1.2 is the evaluator the papers' numbers use.
    assert {"torch==2.14.1", "torchvision==0.29.1", "pycocoevalcap==1.2"} <= deps


def test_ci_runs_the_readme_test_command():
    ci = (ROOT / ".ci" / "run").read_text()
    readme = (ROOT / "README.md").read_text()
    assert "make test" in ci
    head = readme.split("\n## ", 1)[0]
    assert "make reproduce" in head and "make test" in head
