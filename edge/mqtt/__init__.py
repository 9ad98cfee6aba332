"""The wire protocol shared by the device agent and the fleet side.

``topics`` formats and parses topic names, ``payloads`` validates versioned JSON payloads (schema in
``schema/``), ``client`` wraps paho-mqtt (TLS, last will, back-off), ``lite`` is the lean MQTT client
the collector uses, ``netloop`` and ``ratelog`` are the network loop and rate-limited logging. Neither
``edge.agent`` nor ``edge.fleet`` is imported from here.
"""
