"""Parallelism applied from outside the model: mesh, TP, AC, compile, FSDP/DDP, PP."""
