"""Reading a Source's Change Lists: what both the publisher and the subscriber need.

The publisher detects new entries to log and push them; a subscriber reads the
same documents to catch up when push could not bring everything.  The reading
is the same, so it lives here, below both (neither imports the other):

* :mod:`.access` -- a Source's documents over HTTP or from a local directory,
  conditional and ranged;
* :mod:`.incremental` -- the pure rules for reading only the bytes appended
  to a growing Change List;
* :mod:`.watcher` -- :class:`~.watcher.CollectionWatcher`, one collection's
  Change List Index and Change Lists polled for the entries after a
  checkpoint (the decisions themselves are :mod:`rsnotify.tracker`'s).
"""
