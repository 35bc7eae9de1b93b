"""Experiments: the cached runs behind each notebook, the one config system (profiles as JSON) and the run cache."""
