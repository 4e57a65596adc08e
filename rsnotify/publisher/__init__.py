"""``rsnotify publish``: watch a Source's Change Lists, log and push every new entry.

Pure decisions live in :mod:`rsnotify.tracker` (what is new); reading the
Change Lists (document access over HTTP or a directory, only the new bytes of
a growing list) is :mod:`rsnotify.changes`, shared with the subscriber.  This
package holds what only a publisher does with them: its options and role
(:mod:`.config`), start-up discovery (:mod:`.startup`), sequencing into the
log (:mod:`.sequencer`), the detection loops (:mod:`.detection`,
:mod:`.frameworkwatch`, :mod:`.fswatch`), the transports (:mod:`.transports`),
leader election (:mod:`.leader`), advertising the channels
(:mod:`.advertisement`, :mod:`.console`), all wired in :mod:`.service`.
"""
