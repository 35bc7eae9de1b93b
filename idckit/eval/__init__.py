"""Evaluation: caption metrics per subset (the papers' protocol), retrieval metrics, and the judge-gate analysis."""
