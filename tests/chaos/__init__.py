"""Fault-injection matrix, network partitions and soak for rsnotify (issue 8).

Every scenario runs the real thing as separate processes -- ``rsnotify
simulate``, ``rsnotify publish`` (Redis log, MQTT and WebSocket), one MQTT and
one WebSocket ``rsnotify subscribe`` -- against private Mosquitto and Redis
instances, injects one fault repeatedly while the Source keeps changing, then
freezes the Source and checks what the subscribers ended up with.

* :mod:`.stack` starts and measures the stack (published, applied, lag);
* :mod:`.faults` holds the scenarios (one fault each);
* :mod:`.netns` builds the network namespace for the partition scenario;
* :mod:`.matrix` runs scenarios and writes ``chaos-report.json``;
* :mod:`.soak` is the long run (``make soak``).

``python -m tests.chaos --minutes N [--only FAULT]`` runs the matrix;
``tests/test_chaos.py`` runs every scenario briefly inside ``make test``.
"""
