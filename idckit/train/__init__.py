"""Training: the one loop, its task protocol, learning-rate schedules and data-parallel plumbing."""
