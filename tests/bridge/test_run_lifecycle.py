"""A run's lifecycle as a pure state machine (bridge/runs/lifecycle.py), driven without
processes: the endings the executor takes, and, for any order of events, one ending."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from bridge.core.model import RunStatus
from bridge.runs.lifecycle import (
    ENDINGS,
    AbandonStart,
    Action,
    Answered,
    ClaudeSpawned,
    Conclude,
    DetachAsked,
    DriveCancelled,
    DriveEnded,
    Drop,
    End,
    ErrorResult,
    Event,
    GiveUp,
    Leave,
    Lost,
    Phase,
    Retried,
    RunState,
    StartRecorded,
    StartRefused,
    Stopping,
    Unrecorded,
    advance,
    reattached,
)
from dispatcher import EndReason


def run(*events: Event, state: RunState | None = None) -> tuple[RunState, list[Action]]:
    """Feed ``events`` from ``state`` (a fresh run); the last state and every action."""
    state = state or RunState()
    actions: list[Action] = []
    for event in events:
        state, done = advance(state, event)
        actions += done
    return state, actions


def test_a_run_that_answers_records_its_outcome_at_the_answer() -> None:
    state, actions = run(StartRecorded(), ClaudeSpawned(), Answered(), DriveEnded())
    assert state.phase is Phase.ENDED
    assert actions == [Conclude(), End(record=False)]


def test_a_run_without_an_answer_records_its_outcome_at_its_end() -> None:
    state, actions = run(StartRecorded(), ClaudeSpawned(), ErrorResult(), DriveEnded())
    assert state.phase is Phase.ENDED
    assert state.final
    assert actions == [End(record=True)]


def test_phases_in_order() -> None:
    phases = []
    state = RunState()
    for event in (StartRecorded(), ClaudeSpawned(), Answered(), DriveEnded()):
        state, _ = advance(state, event)
        phases.append(state.phase)
    assert phases == [Phase.STARTED, Phase.RUNNING, Phase.ANSWERED, Phase.ENDED]


def test_a_start_that_cannot_be_recorded_gives_the_prestart_up() -> None:
    state, actions = run(StartRefused())
    assert state.phase is Phase.UNSTARTED
    assert actions == [GiveUp("failed")]


def test_a_stop_before_the_start_is_through_abandons_the_start_as_stopped() -> None:
    state, actions = run(Stopping(EndReason.STOPPED), DriveCancelled())
    assert state.phase is Phase.UNSTARTED
    assert actions == [AbandonStart(RunStatus.STOPPED)]


def test_a_shutdown_before_the_start_abandons_it_as_interrupted() -> None:
    _, actions = run(Stopping(EndReason.INTERRUPTED), DriveCancelled())
    assert actions == [AbandonStart(RunStatus.INTERRUPTED)]


def test_a_stop_during_the_run_records_it_stopped() -> None:
    state, actions = run(StartRecorded(), ClaudeSpawned(), Stopping(EndReason.STOPPED))
    assert state.phase is Phase.STOPPING
    state, actions = run(DriveCancelled(), state=state)
    assert state.phase is Phase.ENDED
    assert actions == [End(record=True, cancelled=RunStatus.STOPPED)]


def test_a_stop_after_the_answer_keeps_the_answer_as_the_outcome() -> None:
    state, actions = run(
        StartRecorded(), ClaudeSpawned(), Answered(), Stopping(EndReason.STOPPED), DriveCancelled()
    )
    assert state.phase is Phase.ENDED
    assert actions == [Conclude(), End(record=False, cancelled=RunStatus.STOPPED)]


def test_a_detaching_shutdown_leaves_a_registered_run_to_its_supervisor() -> None:
    state, actions = run(
        StartRecorded(),
        ClaudeSpawned(),
        Stopping(EndReason.DETACHED),
        DetachAsked(registered=True),
    )
    assert state.detached
    state, actions = run(DriveCancelled(), state=state)
    assert state.phase is Phase.DETACHED
    assert actions == [Leave()]


def test_an_unregistered_run_is_not_detached_but_interrupted() -> None:
    state, actions = run(
        StartRecorded(),
        ClaudeSpawned(),
        Stopping(EndReason.DETACHED),
        DetachAsked(registered=False),
        DriveCancelled(),
    )
    assert not state.detached
    assert actions == [End(record=True, cancelled=RunStatus.INTERRUPTED)]


def test_an_answered_run_is_not_detached() -> None:
    state, _ = run(
        StartRecorded(),
        ClaudeSpawned(),
        Answered(),
        Stopping(EndReason.DETACHED),
        DetachAsked(registered=True),
    )
    assert not state.detached


def test_a_run_cancelled_before_claude_in_a_room_gone_elsewhere_is_moved() -> None:
    state, actions = run(
        StartRecorded(), Stopping(EndReason.INTERRUPTED), DriveCancelled(holds=False)
    )
    assert state.phase is Phase.MOVED
    assert actions == [Drop()]


def test_a_run_that_reached_claude_is_recorded_even_if_its_room_moved() -> None:
    _, actions = run(
        StartRecorded(),
        ClaudeSpawned(),
        Stopping(EndReason.INTERRUPTED),
        DriveCancelled(holds=False),
    )
    assert actions == [End(record=True, cancelled=RunStatus.INTERRUPTED)]
    _, actions = run(
        StartRecorded(),
        Stopping(EndReason.INTERRUPTED),
        DriveCancelled(holds=False, dir_made=True),
    )
    assert actions == [End(record=True, cancelled=RunStatus.INTERRUPTED)]


def test_a_retry_forgets_that_claude_was_reached() -> None:
    state, _ = run(StartRecorded(), ClaudeSpawned(), ErrorResult(), Retried())
    assert state.phase is Phase.STARTED
    assert not state.reached
    assert state.final  # the first try's error closed the run to steering
    _, actions = run(Stopping(None), DriveCancelled(holds=False), state=state)
    assert actions == [Drop()]


def test_a_drive_that_did_not_start_claude_is_moved() -> None:
    state, actions = run(StartRecorded(), DriveEnded(not_started=True))
    assert state.phase is Phase.MOVED
    assert actions == [Drop()]


def test_a_reattached_run_has_reached_claude() -> None:
    state = reattached()
    assert state.phase is Phase.RUNNING
    _, actions = run(Answered(), DriveEnded(), state=state)
    assert actions == [Conclude(), End(record=False)]


def test_flags_of_the_end() -> None:
    state, _ = run(StartRecorded(), ClaudeSpawned(), Lost(), Unrecorded())
    assert state.lost
    assert state.unrecorded


def test_an_ended_run_notes_what_carrying_out_its_end_found() -> None:
    # The outcome is recorded after the run ended (its ending action does it).
    state, _ = run(StartRecorded(), ClaudeSpawned(), DriveEnded(), Lost(), Unrecorded())
    assert state.phase is Phase.ENDED
    assert state.lost
    assert state.unrecorded
    state, _ = run(StartRefused(), Lost(), Unrecorded())
    assert not state.lost
    assert not state.unrecorded


def test_a_stop_after_a_shutdown_restates_why() -> None:
    state, actions = run(
        StartRecorded(),
        Stopping(EndReason.INTERRUPTED),
        Stopping(EndReason.STOPPED),
        DriveCancelled(),
    )
    assert state.stop is EndReason.STOPPED
    assert actions == [End(record=True, cancelled=RunStatus.STOPPED)]


EVENTS: st.SearchStrategy[Event] = st.one_of(
    st.just(StartRecorded()),
    st.just(StartRefused()),
    st.builds(Stopping, st.sampled_from([None, *EndReason])),
    st.just(ClaudeSpawned()),
    st.just(Retried()),
    st.just(Answered()),
    st.just(ErrorResult()),
    st.builds(DetachAsked, st.booleans()),
    st.just(Lost()),
    st.just(Unrecorded()),
    st.builds(DriveEnded, st.booleans()),
    st.builds(DriveCancelled, st.booleans(), st.booleans()),
)
ENDS: st.SearchStrategy[Event] = st.one_of(
    st.builds(DriveEnded, st.booleans()),
    st.builds(DriveCancelled, st.booleans(), st.booleans()),
    st.just(StartRefused()),
)


@given(events=st.lists(EVENTS, max_size=30), end=ENDS, after=st.lists(EVENTS, max_size=10))
def test_any_order_of_events_ends_once_and_records_the_outcome_once(
    events: list[Event], end: Event, after: list[Event]
) -> None:
    state = RunState()
    actions: list[Action] = []
    for event in (*events, end):
        before = state
        state, done = advance(state, event)
        actions += done
        if before.over:
            assert state.phase is before.phase  # no transition out of a final phase
            assert not done
    if not state.over:
        # The executor ends a run whose start never went through by its cancellation.
        state, done = advance(state, DriveCancelled())
        actions += done
    assert state.over
    endings = [a for a in actions if isinstance(a, ENDINGS)]
    assert len(endings) == 1
    # The outcome with its cost: recorded once when the run ended here, never otherwise.
    records = [a for a in actions if isinstance(a, Conclude) or (isinstance(a, End) and a.record)]
    assert len(records) == (1 if state.phase is Phase.ENDED else 0)
    # A Conclude is the answer's record: the ending never records a second outcome.
    if any(isinstance(a, Conclude) for a in actions):
        assert state.phase is Phase.ENDED
    for event in after:
        later, done = advance(state, event)
        assert later.phase is state.phase
        assert not done
