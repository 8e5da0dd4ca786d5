"""The chaos suite: a seeded fault schedule against a replicating flow, then an independent check.

``python -m tests.chaos [--long] [--seed N] [--out DIR]`` runs one schedule and writes the report;
``tests/chaos/test_chaos.py`` runs the CI-sized one (and the long one with ``FERRYMAN_NIGHTLY=1``).
"""
