"""``rsnotify subscribe``: keep a local mirror of a ResourceSync Source, push first, poll always."""
