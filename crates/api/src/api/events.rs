//! Server-Sent Events: one run's events (stored, then live) and the firehose.
//!
//! A run's stream loses nothing and repeats nothing: it subscribes to the run's
//! topic first, then reads the stored events (a read sees every write queued
//! before it), emits them and remembers the last index. Live events at or below
//! that index are dropped; a gap in the live indices (after a lag, or an event
//! that reached the bus before the store) is filled from the store. A run
//! publishes an event before it queues the store write, so an event published
//! just before the subscription can miss both the topic and the first read; a
//! missed event in the middle shows up as a gap, and missed last events are
//! found by checking the run's row whenever the topic has been quiet for
//! [`IDLE_RESYNC`]. The stream ends after `run_completed`, when the topic closes,
//! or at shutdown.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::time::Duration;

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::Stream;
use lemon_core::bus::{BusEvent, RecvError, Subscription};
use lemon_core::ids::RunId;
use lemon_core::store::{StoreHandle, StoredEvent};
use tokio_util::sync::CancellationToken;

use super::transfer::{parse_run_id, run_not_found};
use super::ApiState;
use crate::error::{ApiError, PathParams};

/// How often an idle stream sends a comment so proxies keep it open.
const KEEP_ALIVE_INTERVAL: Duration = Duration::from_secs(15);

/// How long a run's topic may stay quiet before the stream checks the store.
const IDLE_RESYNC: Duration = Duration::from_secs(1);

const RUN_COMPLETED: &str = "run_completed";

/// `GET /v1/runs/{id}/events`. A `Last-Event-ID` header resumes after that index.
pub(super) async fn run_events(
    State(state): State<ApiState>,
    PathParams(raw): PathParams<String>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let run_id = parse_run_id(&raw)?;
    let resume_after = headers
        .get("last-event-id")
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.trim().parse::<u64>().ok())
        .unwrap_or(0);
    // Subscribe before reading the store, so nothing falls between the two.
    let live = state.gateway.bus().subscribe_run(&run_id);
    let store = state.gateway.store().clone();
    if store.get_run(run_id.as_str()).await?.is_none() {
        return Err(run_not_found(&raw));
    }
    let stored = store.run_events(run_id.as_str()).await?;
    let mut stream = RunEventStream {
        run_id,
        live,
        store,
        shutdown: state.shutdown.clone(),
        pending: VecDeque::new(),
        last_index: resume_after,
        finished: false,
    };
    stream.push_stored(stored);
    Ok(sse(futures::stream::unfold(stream, |mut stream| async move {
        let event = stream.next().await?;
        Some((Ok(event), stream))
    })))
}

/// `GET /v1/events`: every event of every run, until shutdown. A subscriber that
/// falls behind gets `event: lagged` with `{"skipped": n}` and carries on.
pub(super) async fn firehose(State(state): State<ApiState>) -> Response {
    let bus = state.gateway.bus();
    let stream = Firehose {
        live: bus.subscribe_all(),
        notices: bus.subscribe_notices(),
        shutdown: state.shutdown.clone(),
    };
    sse(futures::stream::unfold(stream, |mut stream| async move {
        let event = stream.next().await?;
        Some((Ok(event), stream))
    }))
}

fn sse<S>(stream: S) -> Response
where
    S: Stream<Item = Result<Event, Infallible>> + Send + 'static,
{
    Sse::new(stream).keep_alive(KeepAlive::new().interval(KEEP_ALIVE_INTERVAL)).into_response()
}

fn sse_event(kind: &str, index: u64, data: &serde_json::Value) -> Event {
    Event::default().event(kind).id(index.to_string()).data(data.to_string())
}

/// One run's events, stored then live.
#[derive(Debug)]
struct RunEventStream {
    run_id: RunId,
    /// The run's topic, subscribed before the first store read.
    live: Subscription,
    store: StoreHandle,
    shutdown: CancellationToken,
    /// Events ready to send, in index order.
    pending: VecDeque<Event>,
    /// The highest index queued so far; everything at or below it was sent.
    last_index: u64,
    /// `run_completed` is queued (or no more events can come): end once `pending` is empty.
    finished: bool,
}

impl RunEventStream {
    async fn next(&mut self) -> Option<Event> {
        loop {
            if let Some(event) = self.pending.pop_front() {
                return Some(event);
            }
            if self.finished {
                return None;
            }
            let received = tokio::select! {
                biased;
                () = self.shutdown.cancelled() => return None,
                received = self.live.recv() => received,
                () = tokio::time::sleep(IDLE_RESYNC) => {
                    self.catch_up_if_finished().await;
                    continue;
                }
            };
            match received {
                Ok(event) => self.push_live(&event).await,
                Err(RecvError::Lagged(skipped)) => {
                    tracing::debug!(run_id = %self.run_id, skipped, "event stream lagged; reading the store");
                    self.catch_up().await;
                }
                Err(RecvError::Closed) => {
                    // Nothing more will be published; whatever is left is in the store.
                    self.catch_up().await;
                    self.finished = true;
                }
            }
        }
    }

    fn push(&mut self, kind: &str, index: u64, data: &serde_json::Value) {
        if self.finished {
            return;
        }
        if index > self.last_index {
            self.last_index = index;
            self.pending.push_back(sse_event(kind, index, data));
        }
        // Also when the caller resumed past it: nothing follows `run_completed`.
        self.finished = kind == RUN_COMPLETED;
    }

    fn push_stored(&mut self, mut events: Vec<StoredEvent>) {
        events.sort_by_key(|event| event.index);
        for event in events {
            self.push(&event.kind, event.index, &event.data);
        }
    }

    async fn push_live(&mut self, event: &BusEvent) {
        if event.index > self.last_index + 1 {
            self.catch_up().await;
        }
        self.push(event.kind.type_name(), event.index, &event.to_json());
    }

    /// A quiet topic usually means a busy engine; but if the run has finished,
    /// its last events went by before the subscription, so read them from the
    /// store. (A run's row turns terminal only after its `run_completed` is
    /// stored; a missed event before the last shows up as a gap instead.)
    async fn catch_up_if_finished(&mut self) {
        match self.store.get_run(self.run_id.as_str()).await {
            Ok(Some(record)) if !record.status.is_terminal() => {}
            Ok(_) => self.catch_up().await,
            Err(err) => {
                tracing::error!(run_id = %self.run_id, error = %err, "could not read the run; ending the stream");
                self.finished = true;
            }
        }
    }

    /// Queues the stored events after the last one sent.
    async fn catch_up(&mut self) {
        match self.store.run_events(self.run_id.as_str()).await {
            Ok(events) => self.push_stored(events),
            Err(err) => {
                tracing::error!(run_id = %self.run_id, error = %err, "could not read stored events; ending the stream");
                self.finished = true;
            }
        }
    }
}

/// Every event of every run.
#[derive(Debug)]
struct Firehose {
    live: Subscription,
    /// Gateway-wide events (`config_reloaded`, `config_rejected`).
    notices: tokio::sync::broadcast::Receiver<std::sync::Arc<lemon_core::bus::Notice>>,
    shutdown: CancellationToken,
}

impl Firehose {
    async fn next(&mut self) -> Option<Event> {
        let received = tokio::select! {
            biased;
            () = self.shutdown.cancelled() => return None,
            Ok(notice) = self.notices.recv() => {
                return Some(
                    Event::default().event(notice.type_name).data(notice.to_json().to_string()),
                );
            }
            received = self.live.recv() => received,
        };
        match received {
            // No `id:`: indices count per run, so they cannot resume a firehose.
            Ok(event) => Some(
                Event::default().event(event.kind.type_name()).data(event.to_json().to_string()),
            ),
            Err(RecvError::Lagged(skipped)) => Some(
                Event::default()
                    .event("lagged")
                    .data(serde_json::json!({ "skipped": skipped }).to_string()),
            ),
            Err(RecvError::Closed) => None,
        }
    }
}
