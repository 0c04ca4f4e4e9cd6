"""What an export checks: its graphs against PyTorch (validate.py, on reference.py's model; a streamed
target on a sampled model of its layers: sampled.py), a streamed weights file read back against the
checkpoint (stored.py), and the per-CPU precision probe (probe.py)."""
