"""``rsnotify dashboard``: a live page, a JSON API and ``/metrics`` over the telemetry in Redis.

Sans-I/O core (:mod:`.latency`, :mod:`.state`), thin adapters around it
(:mod:`.collector` reads Redis and MQTT, :mod:`.server` serves HTTP and
WebSocket), and a static page in ``static/`` drawn with uPlot (MIT, shipped
in the package: the page works with no internet access).
"""
