"""Everything said to a room: the durable outbox, notices, replies, progress and their pacing."""
