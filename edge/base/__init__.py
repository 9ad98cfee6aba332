"""The floor every wing stands on: helpers that import nothing of edgekit but ``edge.errors``.

``typedjson`` is the strict JSON/TOML reader (typed dataclasses, limits, one-line refusals); ``hashing`` hashes
files. Nothing here may import another wing: ``tests/test_layering.py`` holds the order.
"""
