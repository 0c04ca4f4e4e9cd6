"""Training drafters by self-distillation: the shared loop, its data and prompt mixes."""
