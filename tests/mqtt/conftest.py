"""Fixtures for the wire protocol's tests (edge.mqtt: clients, network loop, topics, payloads): a Mosquitto of the
test's own on a free loopback port (``broker``)."""

from tests.support.mqtt_broker import broker

__all__ = ["broker"]
