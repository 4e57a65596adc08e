"""A WebSub hub nobody here wrote: PyPI's flask-websub, set up as its README says.

Run by ``tests/test_websub_flask.py`` as two processes, all on loopback:

* ``python -m tests.websub_flask_hub`` -- the Flask app with the hub endpoint
  at ``/hub`` (``PUBLISH_SUPPORTED``: it takes ``hub.mode=publish`` pings and
  then fetches the topic, which is how flask-websub learns new content);
* ``celery -A tests.websub_flask_hub:celery worker --pool solo`` -- the
  Celery worker that verifies intent, fetches topics and delivers.

Configured by environment: ``HUB_BROKER`` (the test's own Redis),
``HUB_DB`` (its SQLite file), ``HUB_PORT``.  Only its retry pace is changed
from the defaults (``BACKOFF_BASE``), so a test does not wait minutes.
"""

from __future__ import annotations

import os

from celery import Celery
from flask import Flask
from flask_websub.hub import Hub, SQLite3HubStorage

app = Flask(__name__)
app.config["PUBLISH_SUPPORTED"] = True
app.config["HUB_MIN_LEASE_SECONDS"] = 300

celery = Celery("flask_websub_hub", broker=os.environ.get("HUB_BROKER", "redis://127.0.0.1:6379"))
celery.conf.update(broker_connection_retry_on_startup=True, worker_hijack_root_logger=False)
hub = Hub(
    SQLite3HubStorage(os.environ.get("HUB_DB", "hub.db")),
    celery,
    BACKOFF_BASE=0.5,
    REQUEST_TIMEOUT=5,
    SIGNATURE_ALGORITHM="sha512",
)
app.register_blueprint(hub.build_blueprint(url_prefix="/hub"))


if __name__ == "__main__":
    print(f"flask-websub hub on {os.environ['HUB_PORT']}", flush=True)
    app.run(host="127.0.0.1", port=int(os.environ["HUB_PORT"]), threaded=True)
