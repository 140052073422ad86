"""Planner: hierarchical HPP search and the baselines (pure, no torch)."""
