"""Arm Ethos-U55/U65 microNPUs: full-integer TFLite compiled by Arm's Vela (``format``, ``convert``, ``run``,
``firmware``)."""
