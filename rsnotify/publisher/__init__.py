"""``rsnotify publish``: watch a Source's Change Lists, log and push every new entry.

Pure decisions live in :mod:`rsnotify.tracker` (what is new); reading the
Change Lists (document access over HTTP or a directory, only the new bytes of
a growing list) is :mod:`rsnotify.changes`, shared with the subscriber.  This
package holds what only a publisher does with them, wired in :mod:`.service`.
"""
