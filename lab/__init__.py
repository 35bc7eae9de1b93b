"""The lab: studies, diagnostics and their records, kept apart from the product (lab/README.md)."""
