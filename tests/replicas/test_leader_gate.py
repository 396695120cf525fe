"""The Matrix transport behind the leader lease (bridge/cluster/leader_gate.py) answers
through its own outbound side, all of it: what the bridge asks of a gated transport is
what it would ask of the transport alone (docs/transports.md).

Its forwarders once left out ``approval_fits`` and ``answer_action`` (before the
transport contract's split, issue 26): with replicas a long Matrix tool request was
posted cut instead of whole as a file first, and a transport's own answer to a click
would have been replaced by the contract's default."""

from __future__ import annotations

from typing import cast

from bridge.cluster.leader_gate import LeaderGated
from bridge.cluster.replica import Cluster
from bridge.core.model import ExternalMessageId, Reply, RoomId, RoomKey, TransportName, UserId
from bridge.core.transport import ApprovalAction, ApprovalChoice, Delivery, Duplex
from bridge.outbound.replies import Replier

ROOM = RoomKey(TransportName("matrix"), RoomId("!room:example.org"))
ONE_EVENT = 40
"""What the fake transport shows in one message."""


class ShortMessages(Duplex):
    """A transport whose messages hold :data:`ONE_EVENT` characters and that answers a
    click privately (its own ``answer_action``)."""

    name = TransportName("matrix")

    def __init__(self) -> None:
        self.sent: list[Reply] = []
        self.told: list[tuple[UserId, str]] = []

    async def send(
        self, reply: Reply, delivery: Delivery | None = None
    ) -> ExternalMessageId | None:
        self.sent.append(reply)
        return ExternalMessageId(f"$event{len(self.sent)}")

    def approval_fits(self, room: RoomKey, text: str) -> bool:
        return len(text) <= ONE_EVENT

    async def answer_action(self, action: ApprovalAction, text: str) -> None:
        self.told.append((action.sender, text))


def gated(inner: ShortMessages) -> LeaderGated:
    # The cluster is asked only by ``run`` (who leads): nothing here runs it.
    return LeaderGated(inner, cast(Cluster, object()), retry_s=1.0)


def test_a_gated_transport_says_what_fits_in_one_message_as_the_transport_does() -> None:
    inner = ShortMessages()
    replier = Replier({inner.name: gated(inner)})
    assert replier.approval_fits(ROOM, "x" * ONE_EVENT)
    assert not replier.approval_fits(ROOM, "x" * (ONE_EVENT + 1))


async def test_a_gated_transport_answers_a_click_its_own_way() -> None:
    inner = ShortMessages()
    replier = Replier({inner.name: gated(inner)})
    click = ApprovalAction(
        ROOM, UserId("@bob:example.org"), ExternalMessageId("$request"), ApprovalChoice.ALLOW
    )
    await replier.answer_action(click, "Only an approver may answer this request.")
    assert inner.told == [(UserId("@bob:example.org"), "Only an approver may answer this request.")]
    assert inner.sent == []  # not the contract's default, a reply everyone sees
