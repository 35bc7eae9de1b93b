"""Evaluation: caption metrics per subset (the papers' protocol), retrieval metrics, and two analyses beyond the
papers: the judge gate (:mod:`.judge_gate`) and the difference probe (:mod:`.probe`)."""
