"""Synthetic stand-ins for every dataset, written in exactly the real releases' layouts (offline, seconds to
minutes)."""
