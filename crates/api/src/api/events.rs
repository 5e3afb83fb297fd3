//! Server-Sent Events: one run's events (stored, then live) and the firehose.
//!
//! A run's stream is the router's [`RunFollower`]: it loses nothing and
//! repeats nothing, each event's `id:` is its index, and it ends after
//! `run_completed`, when no more events can come, or at shutdown. It also checks
//! the store whenever the run has been quiet for [`IDLE_RESYNC`], so a
//! completion that was stored but never published ends the stream too.

use std::convert::Infallible;
use std::time::Duration;

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::Stream;
use lemon_core::bus::{RecvError, Subscription};
use lemon_core::router::RunFollower;
use tokio_util::sync::CancellationToken;

use super::transfer::{parse_run_id, run_not_found};
use super::ApiState;
use crate::error::{ApiError, ErrorBody, PathParams};
use crate::openapi::{schema, Errors};

/// How often an idle stream sends a comment so proxies keep it open.
const KEEP_ALIVE_INTERVAL: Duration = Duration::from_secs(15);

/// How long a run's topic may stay quiet before the stream checks the store.
const IDLE_RESYNC: Duration = Duration::from_secs(1);

/// `GET /v1/runs/{id}/events`: the run's events as Server-Sent Events, the
/// stored ones and then the live ones, until `run_completed`.
///
/// A `Last-Event-ID` header resumes after that index.
#[utoipa::path(
    get,
    path = "/v1/runs/{id}/events",
    tag = "runs",
    params(
        ("id" = String, Path, description = "The run id."),
        ("Last-Event-ID" = Option<u64>, Header, description = "Resume after this event index."),
    ),
    responses(
        (status = 200, description = "Server-Sent Events: the run's stored events, then live ones, until `run_completed`.", content_type = "text/event-stream", body = schema::SseEvent),
        (status = 404, description = "No such run.", body = ErrorBody),
        Errors,
    )
)]
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
    let follower = state
        .router
        .follow(&run_id)
        .without_retries()
        .after(resume_after)
        .check_store_when_quiet(IDLE_RESYNC);
    if state.runs.get(&run_id).await?.is_none() {
        return Err(run_not_found(&raw));
    }
    let stream = RunEventStream { follower, shutdown: state.shutdown.clone() };
    Ok(sse(futures::stream::unfold(stream, |mut stream| async move {
        let event = stream.next().await?;
        Some((Ok(event), stream))
    })))
}

/// `GET /v1/events`: every event of every run, until shutdown. A subscriber that
/// falls behind gets `event: lagged` with `{"skipped": n}` and carries on.
#[utoipa::path(
    get,
    path = "/v1/events",
    tag = "runs",
    responses(
        (status = 200, description = "Server-Sent Events: every event of every run, and the gateway's notices.", content_type = "text/event-stream", body = schema::SseEvent),
        Errors,
    )
)]
pub(super) async fn firehose(State(state): State<ApiState>) -> Response {
    let stream = Firehose {
        live: state.router.subscribe_all(),
        notices: state.router.subscribe_notices(),
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
    follower: RunFollower,
    shutdown: CancellationToken,
}

impl RunEventStream {
    async fn next(&mut self) -> Option<Event> {
        let event = tokio::select! {
            biased;
            () = self.shutdown.cancelled() => return None,
            event = self.follower.next() => event?,
        };
        Some(sse_event(event.type_name(), event.index(), &event.to_json()))
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
