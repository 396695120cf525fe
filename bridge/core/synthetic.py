"""Messages no one wrote in chat: a schedule's firing, a webhook's delivery.

They enter the durable inbox like chat messages
(:meth:`bridge.inbound.intake.Intake.accept_synthetic`).
Their external id says where they came from and makes each unique: the
store refuses a second message with the same (transport, room, external id),
so a firing or a delivery never starts twice, across restarts and replicas.
Their sender names the schedule or webhook, which is how the prompt and the
room see who "wrote" them.
"""

from __future__ import annotations

from bridge.core.model import ExternalMessageId, InboundMessage, Message, RoomKey, UserId

SCHEDULE = "schedule:"
WEBHOOK = "webhook:"


def schedule_message(room: RoomKey, name: str, fired_at_iso: str, prompt: str) -> InboundMessage:
    return _synthetic(room, f"{SCHEDULE}{name}", fired_at_iso, prompt)


def webhook_message(room: RoomKey, path: str, delivery: str, text: str) -> InboundMessage:
    return _synthetic(room, f"{WEBHOOK}{path}", delivery, text)


def _synthetic(room: RoomKey, sender: str, occurrence: str, text: str) -> InboundMessage:
    """A message from ``sender``; its id names the occurrence, so a repeat is one message."""
    return InboundMessage(
        room=room,
        sender=UserId(sender),
        text=text,
        external_id=ExternalMessageId(f"{sender}:{occurrence}"),
        mentions_bot=True,  # addressed to the bot, also in a trigger = "mention" room
    )


def is_synthetic(message: Message | InboundMessage) -> bool:
    """Whether ``message`` came from a schedule or a webhook (its text is never a command)."""
    return message.external_id.startswith((SCHEDULE, WEBHOOK))
