"""Lean runtime: drafters, verification, the speculative loop, stats (numpy only, never torch)."""
