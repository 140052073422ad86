"""Discrete-event simulator for plans (pure, no torch)."""
