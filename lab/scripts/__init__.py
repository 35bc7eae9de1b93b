"""The lab's diagnostics: studies outside the papers' tables (lab/README.md says what each asked and found).

Run one from the repository root as ``.venv/bin/python -m lab.scripts.<name> ...``; records go to lab/records/,
plots to lab/notes/img/. The kit (idckit/) never imports from here.
"""
from pathlib import Path

LAB = Path(__file__).resolve().parents[1]
LEARNABILITY = LAB / "records" / "learnability"
BUDGET_CURVE = LAB / "records" / "budget_curve"
NOTES_IMG = LAB / "notes" / "img"
