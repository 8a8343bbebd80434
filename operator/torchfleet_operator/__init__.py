"""torchfleet's Kubernetes operator: reconciles TrainingJobs into pod gangs."""
