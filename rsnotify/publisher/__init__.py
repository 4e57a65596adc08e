"""``rsnotify publish``: watch a Source's Change Lists, log and push every new entry.

Pure decisions live in :mod:`rsnotify.tracker` (what is new) and
:mod:`.incremental` (how to read only the new bytes of a growing list); this
package holds the adapters (document access over HTTP or a directory) and the
wiring (:mod:`.service`).
"""
