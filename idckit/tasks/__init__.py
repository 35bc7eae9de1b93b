"""Training tasks: what each kind of run gives the one training loop (batches, loss, evaluation)."""
