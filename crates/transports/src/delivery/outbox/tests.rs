//! Tests of the generic outbox under paused time, over a channel that is not
//! Telegram: destinations are names, rooms (names starting with `#`) have a cap
//! of their own, and the fake records every call with the (virtual) time it was
//! answered and can be told to fail.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use futures::future::join_all;
use tokio::time::{sleep, Instant};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::checks::{assert_spaced, just_calls, most_calls_in_any_window};
use super::{DeliveryError, Failure, Outbox, OutboxSettings, OutboxStats, Sink, Window};
use crate::delivery::Backoff;

/// A message of the fake channel.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Note {
    to: String,
    body: String,
}

/// What the fake channel answers to a send.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Sent {
    to: String,
    id: u64,
}

/// The fake channel's errors; [`Sink::classify`] says what each means.
#[derive(Debug, Clone, PartialEq, Eq)]
enum PagerError {
    SlowDown(Duration),
    Unavailable,
    Unchanged,
    MovedTo(String),
    Refused(String),
}

impl fmt::Display for PagerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{self:?}")
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Call {
    Send { to: String, body: String },
    Edit { to: String, id: u64, body: String },
}

impl Call {
    fn to(&self) -> &str {
        match self {
            Call::Send { to, .. } | Call::Edit { to, .. } => to,
        }
    }
}

/// A channel that records each call and the time it was answered, and fails
/// the next calls to a destination as scripted. Answers come at once unless
/// given a latency.
#[derive(Debug)]
struct Pager {
    calls: Mutex<Vec<(Call, Instant)>>,
    failures: Mutex<HashMap<String, VecDeque<PagerError>>>,
    next_id: AtomicU64,
    latency: Mutex<Duration>,
    /// The cap of a room.
    room: Window,
}

impl Pager {
    fn new(room: Window) -> Self {
        Pager {
            calls: Mutex::default(),
            failures: Mutex::default(),
            next_id: AtomicU64::new(100),
            latency: Mutex::default(),
            room,
        }
    }

    fn fail_next(&self, to: &str, errors: impl IntoIterator<Item = PagerError>) {
        self.failures.lock().unwrap().entry(to.to_owned()).or_default().extend(errors);
    }

    fn record(&self, call: Call) -> Result<(), PagerError> {
        let to = call.to().to_owned();
        self.calls.lock().unwrap().push((call, Instant::now()));
        match self.failures.lock().unwrap().get_mut(&to).and_then(VecDeque::pop_front) {
            Some(error) => Err(error),
            None => Ok(()),
        }
    }

    fn calls(&self) -> Vec<(Call, Instant)> {
        self.calls.lock().unwrap().clone()
    }

    fn calls_to(&self, to: &str) -> Vec<(Call, Instant)> {
        self.calls().into_iter().filter(|(call, _)| call.to() == to).collect()
    }
}

#[async_trait]
impl Sink for Arc<Pager> {
    type Dest = String;
    type MessageId = u64;
    type Message = Note;
    type Edit = String;
    type Receipt = Sent;
    type Error = PagerError;

    fn destination(&self, note: &Note) -> String {
        note.to.clone()
    }

    fn redirect(&self, note: &mut Note, to: &String) {
        note.to.clone_from(to);
    }

    fn message_id(&self, sent: &Sent) -> u64 {
        sent.id
    }

    fn shown(&self, note: Note) -> Option<String> {
        Some(note.body)
    }

    fn window(&self, to: &String) -> Option<Window> {
        to.starts_with('#').then_some(self.room)
    }

    fn classify(&self, error: &PagerError) -> Failure<String> {
        match error {
            PagerError::SlowDown(wait) => Failure::RetryAfter(*wait),
            PagerError::Unavailable => Failure::Transient,
            PagerError::Unchanged => Failure::AlreadyShown,
            PagerError::MovedTo(to) => Failure::MovedTo(to.clone()),
            PagerError::Refused(_) => Failure::Fatal,
        }
    }

    async fn send(&self, note: &Note) -> Result<Sent, PagerError> {
        let latency = *self.latency.lock().unwrap();
        sleep(latency).await;
        self.record(Call::Send { to: note.to.clone(), body: note.body.clone() })?;
        Ok(Sent { to: note.to.clone(), id: self.next_id.fetch_add(1, Ordering::Relaxed) })
    }

    async fn edit(&self, to: &String, id: &u64, body: &String) -> Result<(), PagerError> {
        let latency = *self.latency.lock().unwrap();
        sleep(latency).await;
        self.record(Call::Edit { to: to.clone(), id: *id, body: body.clone() })
    }
}

/// One call a second per destination, at most 30 in any 1.1 s overall, rooms
/// at most 20 a minute; calls may start at once.
fn settings() -> OutboxSettings {
    OutboxSettings {
        interval: Duration::from_secs(1),
        overall: Some(Window::new(30, Duration::from_millis(1100))),
        send_attempts: 10,
        edit_attempts: 3,
        backoff: Backoff::new(Duration::from_secs(1), Duration::from_secs(60)),
        shutdown_grace: Duration::from_secs(5),
        queue_capacity: 256,
        quiet_start: Duration::ZERO,
    }
}

const ROOM: Window = Window::new(20, Duration::from_secs(60));

struct Harness {
    outbox: Outbox<Arc<Pager>>,
    pager: Arc<Pager>,
    token: CancellationToken,
    tracker: TaskTracker,
    start: Instant,
}

impl Harness {
    fn new() -> Self {
        Harness::with(settings(), ROOM)
    }

    fn with_settings(settings: OutboxSettings) -> Self {
        Harness::with(settings, ROOM)
    }

    fn with(settings: OutboxSettings, room: Window) -> Self {
        let pager = Arc::new(Pager::new(room));
        let token = CancellationToken::new();
        let tracker = TaskTracker::new();
        let outbox = Outbox::spawn(pager.clone(), settings, token.clone(), &tracker);
        Harness { outbox, pager, token, tracker, start: Instant::now() }
    }

    async fn send(&self, to: &str, body: &str) -> Result<Sent, DeliveryError<PagerError>> {
        self.outbox.send(Note { to: to.to_owned(), body: body.to_owned() }).await
    }

    async fn edit(&self, to: &str, id: u64, body: &str) {
        self.outbox.edit(to.to_owned(), id, body.to_owned()).await.unwrap();
    }

    async fn edit_and_wait(
        &self,
        to: &str,
        id: u64,
        body: &str,
    ) -> Result<(), DeliveryError<PagerError>> {
        self.outbox.edit_and_wait(to.to_owned(), id, body.to_owned()).await
    }

    fn since_start(&self, at: Instant) -> Duration {
        at - self.start
    }
}

fn send(to: &str, body: &str) -> Call {
    Call::Send { to: to.to_owned(), body: body.to_owned() }
}

fn edit(to: &str, id: u64, body: &str) -> Call {
    Call::Edit { to: to.to_owned(), id, body: body.to_owned() }
}

#[tokio::test(start_paused = true)]
async fn calls_to_one_destination_are_at_least_an_interval_apart() {
    let h = Harness::new();
    let bodies: Vec<String> = (0..5).map(|i| format!("m{i}")).collect();
    let results = join_all(bodies.iter().map(|body| h.send("ann", body))).await;
    let sent = results.into_iter().collect::<Result<Vec<_>, _>>().unwrap();
    h.edit_and_wait("ann", sent[4].id, "m4 edited").await.unwrap();

    let calls = h.pager.calls();
    assert_eq!(calls.len(), 6);
    assert_spaced(&calls, Duration::from_secs(1));
    assert_eq!(h.since_start(calls[5].1), Duration::from_secs(5));
}

#[tokio::test(start_paused = true)]
async fn the_channel_chooses_its_pacing() {
    // Another channel's figures: four calls a second per destination, at most
    // five a second overall.
    let settings = OutboxSettings {
        interval: Duration::from_millis(250),
        overall: Some(Window::new(5, Duration::from_secs(1))),
        ..settings()
    };
    let h = Harness::with_settings(settings);
    let sends: Vec<(String, String)> =
        (0..12).map(|i| (["ann", "bob"][i % 2].to_owned(), format!("n{i}"))).collect();
    let results = join_all(sends.iter().map(|(to, body)| h.send(to, body))).await;
    assert!(results.iter().all(Result::is_ok), "{results:?}");

    let calls = h.pager.calls();
    let times: Vec<Instant> = calls.iter().map(|(_, at)| *at).collect();
    assert_eq!(most_calls_in_any_window(&times, Duration::from_secs(1)), 5);
    for to in ["ann", "bob"] {
        assert_spaced(&h.pager.calls_to(to), Duration::from_millis(250));
    }
    // Twelve calls at five a second: the last starts in the third second.
    assert_eq!(h.since_start(times[11]), Duration::from_secs(2));
}

#[tokio::test(start_paused = true)]
async fn sends_to_a_destination_keep_their_order_even_through_retries() {
    let h = Harness::new();
    h.pager.fail_next("ann", [PagerError::Unavailable]);
    let results = join_all(["first", "second", "third"].map(|body| h.send("ann", body))).await;
    assert!(results.iter().all(Result::is_ok), "{results:?}");
    assert_eq!(
        just_calls(&h.pager.calls()),
        [send("ann", "first"), send("ann", "first"), send("ann", "second"), send("ann", "third")]
    );
}

#[tokio::test(start_paused = true)]
async fn a_destination_with_a_cap_of_its_own_never_exceeds_it() {
    let h = Harness::with(settings(), Window::new(3, Duration::from_secs(10)));
    let bodies: Vec<String> = (0..7).map(|i| format!("r{i}")).collect();
    let results = join_all(bodies.iter().map(|body| h.send("#ops", body))).await;
    assert!(results.iter().all(Result::is_ok));

    let times: Vec<Instant> = h.pager.calls().iter().map(|(_, at)| *at).collect();
    assert_eq!(times.len(), 7);
    assert_eq!(most_calls_in_any_window(&times, Duration::from_secs(10)), 3);
    // The fourth call waits for the first to leave the window.
    assert_eq!(h.since_start(times[3]), Duration::from_secs(10));
    // A destination without a cap of its own is held to the interval only.
    let direct: Vec<String> = (0..5).map(|i| format!("d{i}")).collect();
    let start = Instant::now();
    join_all(direct.iter().map(|body| h.send("ann", body))).await;
    assert_eq!(Instant::now() - start, Duration::from_secs(4));
}

#[tokio::test(start_paused = true)]
async fn many_destinations_never_exceed_the_overall_cap_and_all_are_served() {
    let h = Harness::new();
    let mut sends = Vec::new();
    for round in 0..3 {
        for n in 1..=40 {
            sends.push((format!("user{n}"), format!("user {n} message {round}")));
        }
    }
    let results = join_all(sends.iter().map(|(to, body)| h.send(to, body))).await;
    assert!(results.iter().all(Result::is_ok));

    let calls = h.pager.calls();
    assert_eq!(calls.len(), 120);
    let times: Vec<Instant> = calls.iter().map(|(_, at)| *at).collect();
    assert_eq!(most_calls_in_any_window(&times, Duration::from_secs(1)), 30);
    for n in 1..=40 {
        let to = h.pager.calls_to(&format!("user{n}"));
        assert_eq!(to.len(), 3, "user{n}");
        assert_spaced(&to, Duration::from_secs(1));
        // Taking turns: every destination gets its first message within two seconds.
        assert!(h.since_start(to[0].1) < Duration::from_secs(2), "user{n} starved");
    }
}

#[tokio::test(start_paused = true)]
async fn a_busy_destination_does_not_starve_the_others() {
    let h = Harness::new();
    let busy: Vec<String> = (0..10).map(|i| format!("busy {i}")).collect();
    let busy_sends = join_all(busy.iter().map(|body| h.send("ann", body)));
    let other = async {
        sleep(Duration::from_millis(2500)).await;
        h.send("bob", "other").await.unwrap();
        Instant::now()
    };
    let (_, other_done) = tokio::join!(busy_sends, other);
    assert_eq!(h.since_start(other_done), Duration::from_millis(2500));
}

#[tokio::test(start_paused = true)]
async fn quick_edits_collapse_and_the_last_wins() {
    let h = Harness::new();
    let note = h.send("ann", "Running…").await.unwrap();
    for i in 0..9 {
        h.edit("ann", note.id, &format!("step {i}")).await;
    }
    h.edit_and_wait("ann", note.id, "Done.").await.unwrap();

    let edits: Vec<Call> = just_calls(&h.pager.calls())
        .into_iter()
        .filter(|c| matches!(c, Call::Edit { .. }))
        .collect();
    assert_eq!(edits, [edit("ann", note.id, "Done.")]);
    let stats = h.outbox.stats();
    assert_eq!(stats.n_coalesced, 9);
    assert_eq!(stats.n_edited, 1);
}

#[tokio::test(start_paused = true)]
async fn an_edit_identical_to_what_is_shown_makes_no_call() {
    let h = Harness::new();
    let note = h.send("ann", "hello").await.unwrap();
    h.edit_and_wait("ann", note.id, "hello").await.unwrap();
    h.edit_and_wait("ann", note.id, "world").await.unwrap();
    h.edit_and_wait("ann", note.id, "world").await.unwrap();

    assert_eq!(just_calls(&h.pager.calls()), [send("ann", "hello"), edit("ann", note.id, "world")]);
    assert_eq!(h.outbox.stats().n_skipped_identical, 2);
}

#[tokio::test(start_paused = true)]
async fn an_edit_back_to_the_shown_content_while_another_is_in_flight_is_made() {
    // While "b" is on its way, the message still shows "a"; going back to "a"
    // needs a call of its own once "b" has landed.
    let h = Harness::new();
    let note = h.send("ann", "a").await.unwrap();
    *h.pager.latency.lock().unwrap() = Duration::from_millis(500);
    h.edit("ann", note.id, "b").await;
    sleep(Duration::from_millis(1200)).await;
    h.edit_and_wait("ann", note.id, "a").await.unwrap();

    let calls = h.pager.calls();
    assert_eq!(
        just_calls(&calls),
        [send("ann", "a"), edit("ann", note.id, "b"), edit("ann", note.id, "a")]
    );
    // Recorded when answered: "b" at 1.5 s; "a" starts an interval after that
    // answer, at 2.5 s, and is answered at 3 s.
    assert_eq!(h.since_start(calls[2].1), Duration::from_millis(3000));
}

#[tokio::test(start_paused = true)]
async fn already_shown_counts_as_success_for_an_edit_but_not_for_a_send() {
    let h = Harness::new();
    let note = h.send("ann", "a").await.unwrap();
    h.pager.fail_next("ann", [PagerError::Unchanged]);
    assert_eq!(h.edit_and_wait("ann", note.id, "b").await, Ok(()));
    // What the message shows is now known: the same edit is skipped.
    h.edit_and_wait("ann", note.id, "b").await.unwrap();
    assert_eq!(h.pager.calls().len(), 2);
    assert_eq!(h.outbox.stats().n_edited, 1);

    h.pager.fail_next("ann", [PagerError::Unchanged]);
    let result = h.send("ann", "c").await;
    assert_eq!(result, Err(DeliveryError::Failed { attempts: 1, error: PagerError::Unchanged }));
}

#[tokio::test(start_paused = true)]
async fn retry_after_holds_the_destination_then_makes_the_call_again() {
    let h = Harness::new();
    h.pager.fail_next("ann", [PagerError::SlowDown(Duration::from_secs(5))]);
    let limited = h.send("ann", "hello");
    let other = async {
        sleep(Duration::from_secs(1)).await;
        h.send("bob", "meanwhile").await
    };
    let (limited, other) = tokio::join!(limited, other);
    assert_eq!(limited.unwrap().to, "ann");
    assert!(other.is_ok());

    let to_ann = h.pager.calls_to("ann");
    assert_eq!(just_calls(&to_ann), [send("ann", "hello"), send("ann", "hello")]);
    assert_eq!(to_ann[1].1 - to_ann[0].1, Duration::from_secs(5));
    // Another destination is not held up.
    assert_eq!(h.since_start(h.pager.calls_to("bob")[0].1), Duration::from_secs(1));
    assert_eq!(h.outbox.stats().n_rate_limited, 1);
}

#[tokio::test(start_paused = true)]
async fn retry_after_does_not_use_up_attempts() {
    let settings = OutboxSettings { send_attempts: 2, ..settings() };
    let h = Harness::with_settings(settings);
    h.pager.fail_next("ann", std::iter::repeat_n(PagerError::SlowDown(Duration::from_secs(2)), 4));
    h.pager.fail_next("ann", [PagerError::Unavailable]);
    assert!(h.send("ann", "hello").await.is_ok());
    assert_eq!(h.pager.calls().len(), 6);
    let stats = h.outbox.stats();
    assert_eq!((stats.n_rate_limited, stats.n_retries, stats.n_failed), (4, 1, 0));
    // The same counts, for metrics.
    let calls = h.outbox.backlog().calls();
    assert_eq!((calls.n_sent, calls.n_rate_limited, calls.n_retried, calls.n_failed), (1, 4, 1, 0));
}

#[tokio::test(start_paused = true)]
async fn retry_after_holds_back_edits_of_that_destination_too() {
    let h = Harness::new();
    let note = h.send("ann", "a").await.unwrap();
    h.pager.fail_next("ann", [PagerError::SlowDown(Duration::from_secs(30))]);
    h.edit("ann", note.id, "b").await;
    sleep(Duration::from_secs(2)).await;
    h.edit("ann", note.id, "c").await;
    h.edit_and_wait("ann", note.id, "d").await.unwrap();

    let calls = h.pager.calls();
    assert_eq!(
        just_calls(&calls),
        [send("ann", "a"), edit("ann", note.id, "b"), edit("ann", note.id, "d")]
    );
    assert!(calls[2].1 - calls[1].1 >= Duration::from_secs(30));
}

#[tokio::test(start_paused = true)]
async fn transient_errors_are_retried_with_growing_backoff() {
    let h = Harness::new();
    h.pager.fail_next("ann", [PagerError::Unavailable, PagerError::Unavailable]);
    let sent = h.send("ann", "hello").await.unwrap();
    assert_eq!(sent.to, "ann");

    let calls = h.pager.calls();
    assert_eq!(calls.len(), 3);
    assert_eq!(calls[1].1 - calls[0].1, Duration::from_secs(1));
    assert_eq!(calls[2].1 - calls[1].1, Duration::from_secs(2));
    assert_eq!(h.outbox.stats().n_retries, 2);
}

#[tokio::test(start_paused = true)]
async fn a_refused_send_fails_at_once() {
    let h = Harness::new();
    let refusal = PagerError::Refused("no such user".to_owned());
    h.pager.fail_next("ann", [refusal.clone()]);
    let result = h.send("ann", "hello").await;
    assert_eq!(result, Err(DeliveryError::Failed { attempts: 1, error: refusal }));
    assert_eq!(h.pager.calls().len(), 1);
    assert_eq!(h.outbox.stats().n_failed, 1);
    assert_eq!(h.outbox.backlog().calls().n_failed, 1);
    // The destination keeps working.
    assert!(h.send("ann", "again").await.is_ok());
}

#[tokio::test(start_paused = true)]
async fn a_send_gives_up_after_its_attempts_with_the_last_error() {
    let h = Harness::with_settings(OutboxSettings { send_attempts: 3, ..settings() });
    h.pager.fail_next("ann", std::iter::repeat_n(PagerError::Unavailable, 10));
    let result = h.send("ann", "hello").await;
    assert_eq!(result, Err(DeliveryError::Failed { attempts: 3, error: PagerError::Unavailable }));
    assert_eq!(h.pager.calls().len(), 3);
}

#[tokio::test(start_paused = true)]
async fn a_failing_progress_edit_is_dropped_but_an_awaited_one_reports_its_error() {
    let h = Harness::new();
    let note = h.send("ann", "a").await.unwrap();
    h.pager.fail_next("ann", std::iter::repeat_n(PagerError::Unavailable, 3));
    h.edit("ann", note.id, "b").await;
    sleep(Duration::from_secs(30)).await;
    assert_eq!(h.pager.calls().len(), 4, "one send and three attempts of the edit");
    assert_eq!(h.outbox.stats().n_failed, 1);

    let gone = PagerError::Refused("message gone".to_owned());
    h.pager.fail_next("ann", [gone.clone()]);
    let result = h.edit_and_wait("ann", note.id, "c").await;
    assert_eq!(result, Err(DeliveryError::Failed { attempts: 1, error: gone }));
}

#[tokio::test(start_paused = true)]
async fn a_send_goes_ahead_of_queued_edits() {
    let h = Harness::new();
    let progress = h.send("ann", "Running…").await.unwrap();
    h.edit("ann", progress.id, "Running… 1").await;
    let answer = h.send("ann", "The answer").await.unwrap();
    h.edit_and_wait("ann", progress.id, "Done.").await.unwrap();

    assert_eq!(
        just_calls(&h.pager.calls()),
        [send("ann", "Running…"), send("ann", "The answer"), edit("ann", progress.id, "Done.")]
    );
    assert_ne!(answer.id, progress.id);
}

#[tokio::test(start_paused = true)]
async fn a_moved_destination_gets_the_message_at_its_new_place() {
    let h = Harness::new();
    h.pager.fail_next("#old", [PagerError::MovedTo("#new".to_owned())]);
    let (first, second) = tokio::join!(h.send("#old", "one"), h.send("#old", "two"));
    assert_eq!(first.unwrap().to, "#new");
    assert_eq!(second.unwrap().to, "#new");
    h.send("#old", "three").await.unwrap();
    assert_eq!(
        just_calls(&h.pager.calls()),
        [send("#old", "one"), send("#new", "one"), send("#new", "two"), send("#new", "three")]
    );
}

#[tokio::test(start_paused = true)]
async fn an_edit_at_a_moved_destination_is_refused() {
    let h = Harness::new();
    let note = h.send("#old", "one").await.unwrap();
    let moved = PagerError::MovedTo("#new".to_owned());
    h.pager.fail_next("#old", [moved.clone()]);
    let result = h.edit_and_wait("#old", note.id, "two").await;
    assert_eq!(result, Err(DeliveryError::Failed { attempts: 1, error: moved }));
    assert_eq!(h.pager.calls().len(), 2);
}

#[tokio::test(start_paused = true)]
async fn shutdown_answers_pending_sends() {
    let h = Harness::new();
    let sends = join_all(["one", "two", "three"].map(|body| h.send("ann", body)));
    let stop = async {
        sleep(Duration::from_millis(1500)).await;
        h.token.cancel();
    };
    let (results, ()) = tokio::join!(sends, stop);
    assert!(results[0].is_ok());
    assert!(results[1].is_ok());
    assert_eq!(results[2], Err(DeliveryError::ShuttingDown));
    assert_eq!(h.pager.calls().len(), 2);

    h.tracker.close();
    h.tracker.wait().await;
    assert_eq!(h.send("ann", "late").await, Err(DeliveryError::ShuttingDown));
    assert_eq!(
        h.outbox.edit("ann".to_owned(), 1, "x".to_owned()).await,
        Err(DeliveryError::ShuttingDown)
    );
}

#[tokio::test(start_paused = true)]
async fn shutdown_answers_waiting_edits() {
    let h = Harness::new();
    let note = h.send("ann", "a").await.unwrap();
    h.pager.fail_next("ann", [PagerError::SlowDown(Duration::from_secs(60))]);
    let waiting = h.edit_and_wait("ann", note.id, "b");
    let stop = async {
        sleep(Duration::from_secs(10)).await;
        h.token.cancel();
    };
    let (result, ()) = tokio::join!(waiting, stop);
    assert_eq!(result, Err(DeliveryError::ShuttingDown));
    assert_eq!(h.since_start(Instant::now()), Duration::from_secs(10));
}

#[tokio::test(start_paused = true)]
async fn shutdown_lets_a_call_already_made_finish() {
    // Answering "shutting down" for a message that did arrive would make the
    // caller deliver it twice.
    let h = Harness::new();
    *h.pager.latency.lock().unwrap() = Duration::from_millis(500);
    let stop = async {
        sleep(Duration::from_millis(200)).await;
        h.token.cancel();
    };
    let (result, ()) = tokio::join!(h.send("ann", "in flight"), stop);
    assert_eq!(result.unwrap().to, "ann");
    h.tracker.close();
    h.tracker.wait().await;
    assert_eq!(h.since_start(Instant::now()), Duration::from_millis(500));
}

#[tokio::test(start_paused = true)]
async fn shutdown_does_not_wait_longer_than_its_grace() {
    let h = Harness::with_settings(OutboxSettings {
        shutdown_grace: Duration::from_secs(2),
        ..settings()
    });
    *h.pager.latency.lock().unwrap() = Duration::from_secs(3600);
    let stop = async {
        sleep(Duration::from_secs(1)).await;
        h.token.cancel();
    };
    let (result, ()) = tokio::join!(h.send("ann", "stuck"), stop);
    assert_eq!(result, Err(DeliveryError::ShuttingDown));
    assert_eq!(h.since_start(Instant::now()), Duration::from_secs(3));
}

#[tokio::test(start_paused = true)]
async fn dropping_every_handle_delivers_queued_edits_then_stops() {
    let h = Harness::new();
    let note = h.send("ann", "Running…").await.unwrap();
    h.edit("ann", note.id, "Done.").await;
    let Harness { outbox, pager, tracker, .. } = h;
    drop(outbox);
    tracker.close();
    tracker.wait().await;
    assert_eq!(
        just_calls(&pager.calls()),
        [send("ann", "Running…"), edit("ann", note.id, "Done.")]
    );
}

#[tokio::test(start_paused = true)]
async fn stats_start_at_zero() {
    let h = Harness::new();
    assert_eq!(h.outbox.stats(), OutboxStats::default());
    h.send("ann", "x").await.unwrap();
    assert_eq!(h.outbox.stats(), OutboxStats { n_sent: 1, ..OutboxStats::default() });
}

#[tokio::test(start_paused = true)]
async fn the_quiet_start_holds_the_first_call() {
    let h = Harness::with_settings(OutboxSettings {
        quiet_start: Duration::from_millis(700),
        ..settings()
    });
    h.send("ann", "after the restart").await.expect("delivered");
    let calls = h.pager.calls();
    assert_eq!(calls.len(), 1);
    assert_eq!(h.since_start(calls[0].1), Duration::from_millis(700));
}

#[tokio::test(start_paused = true)]
async fn the_backlog_counts_what_is_queued_or_in_flight_until_it_is_delivered() {
    let h = Harness::new();
    *h.pager.latency.lock().unwrap() = Duration::from_secs(10);
    let backlog = h.outbox.backlog();
    assert_eq!(backlog.get(), 0);
    let bodies: Vec<String> = (0..5).map(|i| format!("m{i}")).collect();
    let sends = join_all(bodies.iter().map(|body| h.send("ann", body)));
    let watch = async {
        // One in flight, four queued behind it.
        lemon_core::testing::within("the backlog to reach 5", async {
            while backlog.get() != 5 {
                tokio::task::yield_now().await;
            }
        })
        .await;
    };
    let (results, ()) = tokio::join!(sends, watch);
    assert!(results.iter().all(Result::is_ok), "{results:?}");
    lemon_core::testing::within("the backlog to drain", async {
        while backlog.get() != 0 {
            tokio::task::yield_now().await;
        }
    })
    .await;
}
