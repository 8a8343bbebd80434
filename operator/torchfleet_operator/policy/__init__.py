"""Lifecycle policies, one file each: failure/restart, success, deadline, TTL,
suspend, clean-pod. Pure: plain values in, decisions out."""
