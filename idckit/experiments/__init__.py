"""Experiments: the cached runs behind each notebook (one module per paper family, the same ``setup`` /
``run_variant(setup, variant, seed)`` API, named recipes in :mod:`.recipes`), the report rows (:mod:`.reporting`), the
one config system (profiles as JSON) and the run cache."""
