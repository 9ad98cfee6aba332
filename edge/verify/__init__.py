"""Does the converted model compute what the source computes? Parity, reference pairs and their inputs.

``inputs`` chooses the data (the user's, else generated to match each input's shape, dtype and range;
calibration sets too), ``parity`` compares a candidate runner with the reference, ``tasks`` holds the
task metrics (top-k, detections by IoU, ...), ``refpairs`` writes and re-checks the few input/output
pairs a bundle carries so a device can check itself on first load.
"""
