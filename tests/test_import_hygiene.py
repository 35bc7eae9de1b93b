"""Imports follow need: the training path (loop, models, tasks, the experiments' training entry points, the command
line, the GPU check) imports no evaluation, notebook or NLP package at module import. Checked in a fresh interpreter
whose import system refuses those packages and records every attempt (so a ``try: import ... except ImportError``
that would hide the import is caught too)."""
from __future__ import annotations

import json
import os
import pkgutil
import subprocess
import sys
from pathlib import Path

import idckit

ROOT = Path(idckit.__file__).resolve().parents[1]

#: what only evaluation (scoring, POS tagging) and the notebooks' tooling may import, and only when they run
HEAVY = ("pycocoevalcap", "papermill", "stanza", "nltk", "jupyter", "jupyter_client", "jupyter_core", "jupyterlab",
         "jupyter_server", "jupytext", "nbformat", "nbclient", "nbconvert", "ipykernel", "IPython")

BLOCKER = """
import atexit, importlib.abc, importlib.machinery, json, sys
BLOCKED, TRIED = set({blocked!r}), []
class Refuse(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    # a spec for a blocked name (a probe such as importlib.util.find_spec, which torch makes, still succeeds); the
    # import itself fails when the module would be created, and is recorded
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            return importlib.machinery.ModuleSpec(name, self)
    def create_module(self, spec):
        TRIED.append(spec.name)
        raise ImportError(f"{{spec.name}} is blocked: the training path must not import it")
    def exec_module(self, module):
        pass
sys.meta_path.insert(0, Refuse())
atexit.register(lambda: print("TRIED=" + json.dumps(sorted(set(TRIED))), file=sys.stderr))
"""


def run_blocked(code: str, blocked=HEAVY, timeout: int = 600, env: dict | None = None) -> tuple[int, str, list[str]]:
    """Run ``code`` in a fresh interpreter that refuses ``blocked``; (exit code, output, the imports it tried)."""
    script = BLOCKER.format(blocked=tuple(blocked)) + code
    proc = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})})
    tried = [json.loads(line[6:]) for line in proc.stderr.splitlines() if line.startswith("TRIED=")]
    return proc.returncode, proc.stdout + proc.stderr, tried[-1] if tried else ["<no record: the run died>"]


def _package_modules(package: str) -> list[str]:
    mod = __import__(package, fromlist=["_"])
    return [f"{package}.{m.name}" for m in pkgutil.iter_modules(mod.__path__)]


def training_path() -> list[str]:
    experiments = [f"idckit.experiments.{m}" for m in ("config", "base", "data", "runs", "recipes", "pcl",
                                                        "clip4idc", "duda", "birds")]
    present = [m for m in experiments if (ROOT / (m.replace(".", "/") + ".py")).is_file()]
    assert {"idckit.experiments.config", "idckit.experiments.pcl", "idckit.experiments.clip4idc",
            "idckit.experiments.duda", "idckit.experiments.birds"} <= set(present)
    return (_package_modules("idckit.train") + _package_modules("idckit.models") + _package_modules("idckit.tasks")
            + present + ["idckit.cli.gpu_check", "idckit.cli.verify_data", "idckit.cli"])


def test_training_path_imports_no_evaluation_or_notebook_package():
    modules = training_path()
    assert "idckit.train.loop" in modules and "idckit.models.pcl" in modules and "idckit.tasks.pcl" in modules
    code, out, tried = run_blocked(f"import importlib\nfor m in {modules!r}:\n    importlib.import_module(m)\n"
                                   "print('imported', len(sys.modules))\n")
    assert code == 0, out[-3000:]
    assert tried == [], f"the training path tried to import {tried}"


def test_the_blocker_catches_an_import():
    """The check can fail: importing the evaluator's scorer from the blocked interpreter is refused and recorded."""
    code, out, tried = run_blocked("try:\n    import pycocoevalcap.cider.cider\nexcept ImportError:\n    pass\n")
    assert code == 0, out
    assert tried == ["pycocoevalcap"]
