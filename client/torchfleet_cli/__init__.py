"""torchfleet's command (``torchfleet``, also ``kubectl torchfleet``) and its
Python client for notebooks: submit a script of one's own as a TrainingJob,
follow its progress, read its logs. Imports no torch."""

from torchfleet_cli.client import Client, Job, JobNotFound
from torchfleet_cli.packing import CONFIGMAP_LIMIT_BYTES, PackingError

__all__ = ["CONFIGMAP_LIMIT_BYTES", "Client", "Job", "JobNotFound", "PackingError"]
