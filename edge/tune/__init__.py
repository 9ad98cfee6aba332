"""The tuner: which runner options make a bundle fastest on this host or on a device.

``space`` declares what may be tried, ``measure`` times one trial, ``search`` runs the study (successive
halving over rungs, ``rungs``) with ``cache`` (conversions by recipe key), ``study`` (the resumable study file) and
``ranking`` (who goes on, who wins), ``report`` renders it, ``remote`` drives trials on a device over MQTT (``remote_link``: its artifact server and MQTT link).
The tuned-settings file a bundle carries is ``edge.pipeline.overlay`` (the pipeline applies it; the tuner
writes it).
"""
