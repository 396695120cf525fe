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
    return InboundMessage(
        room=room,
        sender=UserId(f"{SCHEDULE}{name}"),
        text=prompt,
        external_id=ExternalMessageId(f"{SCHEDULE}{name}:{fired_at_iso}"),
        mentions_bot=True,  # addressed to the bot, also in a trigger = "mention" room
    )


def webhook_message(room: RoomKey, path: str, delivery: str, text: str) -> InboundMessage:
    return InboundMessage(
        room=room,
        sender=UserId(f"{WEBHOOK}{path}"),
        text=text,
        external_id=ExternalMessageId(f"{WEBHOOK}{path}:{delivery}"),
        mentions_bot=True,
    )


def is_synthetic(message: Message | InboundMessage) -> bool:
    """Whether ``message`` came from a schedule or a webhook (its text is never a command)."""
    return message.external_id.startswith((SCHEDULE, WEBHOOK))
