"""torchfleet's trainer runtime: what runs inside a TrainingJob's pods."""
