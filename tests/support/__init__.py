"""Helpers the tests share: servers (brokers, databases, sshd), model builders, the import graph."""
