"""The tuner: which runner options make a bundle fastest on this host or on a device.

``space`` declares what may be tried, ``measure`` times one trial, ``search`` runs the study (successive
halving over rungs, ``rungs``), ``report`` renders it, ``overlay`` is the tuned-settings file a bundle
carries, ``remote`` drives trials on a device over MQTT.
"""
