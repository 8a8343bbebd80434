"""Lifecycle policies, one file each; each owns its whole decision (it classifies
and applies: the status it sets, the children it deletes, the events it posts).

failure (restart or fail, back-off, lost nodes), elastic (replace alone,
resize), kueue (gate, place, evict, release) over admission (Kueue's objects),
gang (create what is missing, phase), success, deadline, suspend, finish
(clean pods) with clean_pod and ttl, invalid (specs that do not parse),
reporting (counts and progress), managed (jobs another controller runs,
spec.managedBy). Pure: a planning.Pass in, decisions into it.
"""
