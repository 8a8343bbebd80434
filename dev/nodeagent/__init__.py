"""A development node agent: runs the pods bound to its nodes as local processes.

Not part of the product: the e2e tests and `make demo` use it so that the pods
the operator creates really train, on a machine with no container runtime.
See README.md in this folder.
"""
