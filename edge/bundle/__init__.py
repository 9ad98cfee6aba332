"""The deployable unit and its trust: a bundle directory, its typed manifest, signatures and trust stores.

``bundle`` opens and verifies a bundle (exactly its listed files, each hash checked), ``schema`` reads a
manifest into typed dataclasses (read strictly by ``edge.base.typedjson``), ``manifest`` writes one,
``signing`` and ``trust`` sign a manifest and decide whether a device accepts it. Nothing here
runs a model or a parity check: the caller does (``edge.verify``).
"""
