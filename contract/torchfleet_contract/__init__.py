"""What the operator and the trainer share, and nothing else: the pod contract
(``pod``: every env variable, metric, exit code and report name that crosses
from one to the other) and the trainer config schema (``trainer_config``: the
model the operator embeds in the CRD and the trainer validates again in the pod).

Both packages import this one and neither imports the other, so a name that
crosses between them has one home and either side can change its insides
alone (tests/unit/test_package_boundaries.py keeps it so). It needs only
pydantic and PyYAML: the operator's image carries no trainer and no torch.
"""
