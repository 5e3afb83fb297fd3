//! The echo engine: answers with the prompt, streamed word by word.
//!
//! With `delay_ms = 0` and a short prompt every event fits the run's channel, so
//! `start` sends them inline without spawning a task; otherwise a task streams the
//! words with the delay between them. Either way a cancel stops the stream. A
//! fresh run starts session `<run id>` (`echo resume <run id>`); a resumed run
//! reports the session it continued.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use lemon_core::engine::{
    Capabilities, Completion, Engine, EngineError, EngineEvent, EventSink, ResumeToken, RunControl,
    StartRequest, TrySendError,
};
use lemon_core::ids::EngineId;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// The echo engine.
#[derive(Debug, Clone)]
pub struct EchoEngine {
    id: EngineId,
    delay: Duration,
    /// Streaming tasks, so a shutdown can wait for them.
    tracker: TaskTracker,
}

impl EchoEngine {
    pub fn new(delay: Duration, tracker: TaskTracker) -> Self {
        EchoEngine { id: EngineId::parse("echo").expect("valid engine id"), delay, tracker }
    }
}

/// Cancels the streaming task; cancelling twice or after the end does nothing.
#[derive(Debug)]
struct EchoControl {
    token: CancellationToken,
}

impl RunControl for EchoControl {
    fn cancel(&self) {
        self.token.cancel();
    }
}

/// Splits text into words that keep their following whitespace, so the deltas
/// concatenate back to the exact prompt.
fn chunks(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut current = String::new();
    let mut in_space = false;
    for c in text.chars() {
        if !c.is_whitespace() && in_space {
            out.push(std::mem::take(&mut current));
        }
        in_space = c.is_whitespace();
        current.push(c);
    }
    if !current.is_empty() {
        out.push(current);
    }
    out
}

fn events_of(req: &StartRequest) -> Vec<EngineEvent> {
    // A resumed run continues the session it was given; a fresh one starts a
    // session named after itself.
    let resume = req
        .resume
        .clone()
        .filter(|token| token.engine == "echo")
        .unwrap_or_else(|| ResumeToken::new("echo", req.run_id.as_str()));
    let mut events = Vec::with_capacity(8);
    events.push(EngineEvent::Started {
        resume: Some(resume.clone()),
        title: Some("Echo".to_owned()),
        meta: serde_json::Value::Null,
    });
    events.extend(chunks(&req.prompt).into_iter().map(EngineEvent::Delta));
    events.push(EngineEvent::Completed(Completion::success(String::new(), Some(resume))));
    events
}

#[async_trait]
impl Engine for EchoEngine {
    fn id(&self) -> &EngineId {
        &self.id
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::default()
    }

    async fn start(
        &self,
        req: StartRequest,
        sink: EventSink,
    ) -> Result<Arc<dyn RunControl>, EngineError> {
        let token = CancellationToken::new();
        let mut events = events_of(&req).into_iter();
        if self.delay.is_zero() {
            // Fast path: send what fits now; the rest goes through a task.
            for event in events.by_ref() {
                match sink.try_send(event) {
                    Ok(()) => {}
                    Err(TrySendError::Full(event)) => {
                        let rest: Vec<EngineEvent> =
                            std::iter::once(*event).chain(events).collect();
                        self.tracker.spawn(stream(rest, sink, Duration::ZERO, token.clone()));
                        break;
                    }
                    Err(TrySendError::Closed) => break,
                }
            }
        } else {
            self.tracker.spawn(stream(events.collect(), sink, self.delay, token.clone()));
        }
        Ok(Arc::new(EchoControl { token }))
    }
}

async fn stream(
    events: Vec<EngineEvent>,
    sink: EventSink,
    delay: Duration,
    token: CancellationToken,
) {
    for event in events {
        let is_delta = matches!(event, EngineEvent::Delta(_));
        if is_delta && !delay.is_zero() {
            tokio::select! {
                () = token.cancelled() => return,
                () = tokio::time::sleep(delay) => {}
            }
        }
        tokio::select! {
            () = token.cancelled() => return,
            sent = sink.send(event) => if sent.is_err() { return },
        }
    }
}

#[cfg(test)]
mod tests;
