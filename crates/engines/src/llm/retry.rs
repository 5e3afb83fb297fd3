//! Retries of a turn that failed before anything streamed: rate limits,
//! server errors, network errors and stalls, with exponential backoff and
//! jitter, or the wait a 429's `Retry-After` asked for (capped).
//!
//! Once a turn produced its first event it is never retried: the caller may
//! already have shown the text, and a second answer would repeat it.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures::stream::{self, StreamExt};

use super::{LlmClient, LlmError, LlmRequest, LlmStream};

/// How often and how patiently a turn is retried.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts in all, the first included; 1 retries nothing.
    pub max_attempts: u32,
    /// The wait before the first retry; each later wait doubles it.
    pub initial_delay: Duration,
    /// The longest backoff wait.
    pub max_delay: Duration,
    /// The longest wait a `Retry-After` is honoured for.
    pub max_retry_after: Duration,
    /// Backoff waits are drawn from the upper half of their value, so clients
    /// that failed together do not retry together.
    pub jitter: bool,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_attempts: 4,
            initial_delay: Duration::from_millis(500),
            max_delay: Duration::from_secs(30),
            max_retry_after: Duration::from_secs(60),
            jitter: true,
        }
    }
}

impl RetryPolicy {
    /// One attempt, no retry.
    pub fn none() -> Self {
        RetryPolicy { max_attempts: 1, ..RetryPolicy::default() }
    }

    /// The wait after failed attempt `attempt` (1 for the first) ended in `error`.
    pub fn delay(&self, attempt: u32, error: &LlmError) -> Duration {
        if let LlmError::RateLimited { retry_after: Some(wait), .. } = error {
            return (*wait).min(self.max_retry_after);
        }
        let factor = 2u32.saturating_pow(attempt.saturating_sub(1));
        let backoff = self.initial_delay.saturating_mul(factor).min(self.max_delay);
        if self.jitter {
            let half = backoff / 2;
            let fraction = f64::from(random_u32()) / f64::from(u32::MAX);
            half + half.mul_f64(fraction)
        } else {
            backoff
        }
    }
}

fn random_u32() -> u32 {
    // A v4 UUID is 122 random bits from the OS; 32 of them are plenty here.
    (uuid::Uuid::new_v4().as_u128() & u128::from(u32::MAX)) as u32
}

/// A client retrying another's retryable failures under a [`RetryPolicy`].
#[derive(Debug, Clone)]
pub struct RetryingClient {
    inner: Arc<dyn LlmClient>,
    policy: RetryPolicy,
}

impl RetryingClient {
    pub fn new(inner: Arc<dyn LlmClient>, policy: RetryPolicy) -> Self {
        RetryingClient { inner, policy }
    }

    pub fn policy(&self) -> &RetryPolicy {
        &self.policy
    }
}

#[async_trait]
impl LlmClient for RetryingClient {
    /// Waits for the turn's first event, retrying while there is none; the
    /// stream then starts with it.
    async fn stream(&self, request: LlmRequest) -> Result<LlmStream, LlmError> {
        let mut attempt = 1;
        loop {
            let error = match self.inner.stream(request.clone()).await {
                Ok(mut turn) => match turn.next().await {
                    Some(Ok(first)) => {
                        return Ok(Box::pin(stream::once(async move { Ok(first) }).chain(turn)))
                    }
                    None => return Ok(Box::pin(stream::empty())),
                    Some(Err(error)) => error,
                },
                Err(error) => error,
            };
            if !error.is_retryable() || attempt >= self.policy.max_attempts {
                return Err(error);
            }
            let delay = self.policy.delay(attempt, &error);
            tracing::warn!(attempt, delay_ms = delay.as_millis() as u64, %error, "LLM turn failed, retrying");
            tokio::time::sleep(delay).await;
            attempt += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;
    use std::sync::Mutex;

    use tokio::time::Instant;

    use super::*;
    use crate::llm::{LlmEvent, StopReason};

    type Turn = Result<Vec<Result<LlmEvent, LlmError>>, LlmError>;

    /// Answers each call with the next scripted turn and counts the calls.
    #[derive(Debug)]
    struct Scripted {
        turns: Mutex<VecDeque<Turn>>,
        calls: Mutex<u32>,
    }

    impl Scripted {
        fn new(turns: Vec<Turn>) -> Arc<Self> {
            Arc::new(Scripted { turns: Mutex::new(turns.into()), calls: Mutex::new(0) })
        }

        fn calls(&self) -> u32 {
            *self.calls.lock().expect("calls")
        }
    }

    #[async_trait]
    impl LlmClient for Scripted {
        async fn stream(&self, _request: LlmRequest) -> Result<LlmStream, LlmError> {
            *self.calls.lock().expect("calls") += 1;
            let turn = self.turns.lock().expect("turns").pop_front().expect("a scripted turn");
            turn.map(|events| Box::pin(stream::iter(events)) as LlmStream)
        }
    }

    fn request() -> LlmRequest {
        LlmRequest {
            model: "m".to_owned(),
            system: None,
            messages: Vec::new(),
            tools: Arc::from([]),
            max_tokens: None,
            temperature: None,
        }
    }

    fn answer() -> Turn {
        Ok(vec![Ok(LlmEvent::TextDelta("hi".to_owned())), Ok(LlmEvent::Done(StopReason::EndTurn))])
    }

    fn server_error() -> LlmError {
        LlmError::Server { status: 503, message: "busy".to_owned() }
    }

    fn fixed(max_attempts: u32) -> RetryPolicy {
        RetryPolicy { max_attempts, jitter: false, ..RetryPolicy::default() }
    }

    async fn collect(stream: LlmStream) -> Vec<Result<LlmEvent, LlmError>> {
        stream.collect().await
    }

    #[tokio::test(start_paused = true)]
    async fn a_rate_limit_is_retried_after_its_retry_after() {
        let inner = Scripted::new(vec![
            Err(LlmError::RateLimited {
                retry_after: Some(Duration::from_secs(3)),
                message: "slow down".to_owned(),
            }),
            answer(),
        ]);
        let client = RetryingClient::new(inner.clone(), RetryPolicy::default());
        let start = Instant::now();
        let events = collect(client.stream(request()).await.expect("retried")).await;
        assert_eq!(start.elapsed(), Duration::from_secs(3));
        assert_eq!(events, answer().expect("events"));
        assert_eq!(inner.calls(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_long_retry_after_is_capped() {
        let inner = Scripted::new(vec![
            Err(LlmError::RateLimited {
                retry_after: Some(Duration::from_secs(3600)),
                message: "later".to_owned(),
            }),
            answer(),
        ]);
        let policy = RetryPolicy { max_retry_after: Duration::from_secs(5), ..fixed(2) };
        let start = Instant::now();
        let events =
            collect(RetryingClient::new(inner, policy).stream(request()).await.expect("retried"))
                .await;
        assert_eq!(events, answer().expect("events"));
        assert_eq!(start.elapsed(), Duration::from_secs(5));
    }

    #[tokio::test(start_paused = true)]
    async fn backoff_doubles_between_attempts() {
        let inner = Scripted::new(vec![
            Err(server_error()),
            Err(LlmError::Network { message: "reset".to_owned() }),
            Ok(vec![Err(LlmError::Stalled)]),
            answer(),
        ]);
        let start = Instant::now();
        let client = RetryingClient::new(inner.clone(), fixed(4));
        let events = collect(client.stream(request()).await.expect("the fourth answers")).await;
        assert_eq!(events, answer().expect("events"));
        // 0.5 s, 1 s, 2 s.
        assert_eq!(start.elapsed(), Duration::from_millis(3500));
        assert_eq!(inner.calls(), 4);
    }

    #[tokio::test(start_paused = true)]
    async fn jittered_waits_stay_in_the_upper_half() {
        let policy = RetryPolicy::default();
        for attempt in 1..=8 {
            let full = fixed(4).delay(attempt, &server_error());
            let wait = policy.delay(attempt, &server_error());
            assert!(wait >= full / 2 && wait <= full, "attempt {attempt}: {wait:?} of {full:?}");
        }
        assert_eq!(fixed(4).delay(20, &server_error()), Duration::from_secs(30));
    }

    #[tokio::test(start_paused = true)]
    async fn exhausted_attempts_give_the_last_error() {
        let limited = || LlmError::RateLimited { retry_after: None, message: "no".to_owned() };
        let inner = Scripted::new(vec![Err(limited()), Err(limited()), Err(limited())]);
        let got = RetryingClient::new(inner.clone(), fixed(3)).stream(request()).await;
        assert_eq!(got.err(), Some(limited()));
        assert_eq!(inner.calls(), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn errors_that_will_not_change_are_not_retried() {
        for error in [
            LlmError::Auth { message: "bad key".to_owned() },
            LlmError::ContextOverflow { message: "too long".to_owned() },
            LlmError::Invalid { message: "bad".to_owned() },
        ] {
            let inner = Scripted::new(vec![Err(error.clone()), answer()]);
            let got = RetryingClient::new(inner.clone(), fixed(4)).stream(request()).await;
            assert_eq!(got.err(), Some(error));
            assert_eq!(inner.calls(), 1);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn an_error_after_output_is_given_as_it_is() {
        let inner = Scripted::new(vec![
            Ok(vec![Ok(LlmEvent::TextDelta("par".to_owned())), Err(server_error())]),
            answer(),
        ]);
        let client = RetryingClient::new(inner.clone(), fixed(4));
        let events = collect(client.stream(request()).await.expect("output came")).await;
        assert_eq!(events, vec![Ok(LlmEvent::TextDelta("par".to_owned())), Err(server_error())]);
        assert_eq!(inner.calls(), 1);
    }
}
