"""Fleet side: the collector (MQTT shared subscription into SQLite/PostgreSQL), status, a fleet simulator.

Modules: ``decode`` (checked decoding, every failure a counted reason), ``db`` (one schema,
two databases), ``collector``, ``status``, ``simulate``; the fleet's credentials: ``pki`` (the
fleet CA, device keys and CSRs, signing) and ``acl`` (the broker's per-device ACL).
"""
