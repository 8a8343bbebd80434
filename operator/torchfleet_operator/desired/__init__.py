"""Desired children of a TrainingJob: pure functions from the job to manifests.

Where is a pod's env decided? ``env.py``. Its volumes, resources, labels?
``pods.py``. Names: ``names.py``. Nothing here talks to a cluster.
"""
