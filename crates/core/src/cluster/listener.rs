//! One dedicated connection that LISTENs on the cluster's notification
//! channels and hands what arrives to one consumer.
//!
//! A notification is only a hint that a table changed; the table is the truth.
//! Notifications sent while the connection was down are lost, so after every
//! (re)connection the listener yields [`Notice::Resync`]: the consumer reads
//! the tables again. The connection is not from the pool (a pooled connection
//! would deliver notifications to whoever uses it next) and is pinged, so a
//! connection that died silently is noticed and replaced.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::StreamExt;
use tokio::sync::mpsc;
use tokio_postgres::tls::{MakeTlsConnect, TlsConnect};
use tokio_postgres::{AsyncMessage, Socket};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// The first wait before connecting again after a failed attempt; each next
/// one is twice as long, up to [`RECONNECT_MAX`].
const RECONNECT_FIRST: Duration = Duration::from_millis(100);
/// The longest wait between connection attempts.
const RECONNECT_MAX: Duration = Duration::from_secs(5);
/// How often an idle connection is checked.
const PING_EVERY: Duration = Duration::from_secs(15);
/// How long a check may take before the connection counts as dead.
const PING_TIMEOUT: Duration = Duration::from_secs(10);
/// Notices waiting for the consumer.
const QUEUE: usize = 256;
/// The listener's connection calls itself this (`pg_stat_activity`).
pub const APPLICATION_NAME: &str = "lemon-gateway-listener";

/// A notification channel of the cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Topic {
    /// A control request was sent; the payload is the target node's id.
    Control,
    /// A control request was answered; the payload is its id.
    ControlAnswer,
    /// A run slot was freed or added; no payload.
    Slots,
    /// The cluster config changed; the payload is its new version.
    Config,
    /// A batch of a run's events was committed; the payload is
    /// `<run id>:<highest event index>`.
    Events,
    /// A request was journaled for a session another node owns; the payload
    /// is `<owner node id>\t<session key>`.
    Handoff,
}

impl Topic {
    /// Every topic.
    pub const ALL: [Topic; 6] = [
        Topic::Control,
        Topic::ControlAnswer,
        Topic::Slots,
        Topic::Config,
        Topic::Events,
        Topic::Handoff,
    ];

    /// The PostgreSQL channel name.
    pub fn channel(self) -> &'static str {
        match self {
            Topic::Control => "lemon_control",
            Topic::ControlAnswer => "lemon_control_answer",
            Topic::Slots => "lemon_slots",
            Topic::Config => "lemon_config",
            Topic::Events => "lemon_events",
            Topic::Handoff => "lemon_handoff",
        }
    }

    fn from_channel(channel: &str) -> Option<Self> {
        Topic::ALL.into_iter().find(|t| t.channel() == channel)
    }
}

/// What a [`Listener`] yields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Notice {
    /// A notification on one of the topics listened to.
    Notified { topic: Topic, payload: String },
    /// The listener is (again) listening and may have missed notifications:
    /// read the tables. Also the first item, once listening starts.
    Resync,
}

/// The receiving end of a listening task; the task stops when this is dropped
/// or its token is cancelled.
#[derive(Debug)]
pub struct Listener {
    rx: mpsc::Receiver<Notice>,
}

impl Listener {
    /// Starts listening on `topics` over a connection of its own to `pg` (the
    /// store's connection settings) through `tls`.
    pub fn spawn<T>(
        pg: tokio_postgres::Config,
        tls: T,
        topics: &[Topic],
        tracker: &TaskTracker,
        token: CancellationToken,
    ) -> Listener
    where
        T: MakeTlsConnect<Socket> + Clone + Send + Sync + 'static,
        T::Stream: Send + 'static,
        T::TlsConnect: Send,
        <T::TlsConnect as TlsConnect<Socket>>::Future: Send,
    {
        let (tx, rx) = mpsc::channel(QUEUE);
        let mut pg = pg;
        pg.application_name(APPLICATION_NAME);
        let listen: String =
            topics.iter().map(|t| format!("LISTEN {};", t.channel())).collect::<Vec<_>>().join(" ");
        tracker.spawn(ListenTask { pg, tls, listen, tx, token }.run());
        Listener { rx }
    }

    /// The next notice; `None` once the task stopped.
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub async fn recv(&mut self) -> Option<Notice> {
        self.rx.recv().await
    }
}

/// The task behind a [`Listener`].
struct ListenTask<T> {
    pg: tokio_postgres::Config,
    tls: T,
    /// The `LISTEN` statements, run on every new connection.
    listen: String,
    tx: mpsc::Sender<Notice>,
    token: CancellationToken,
}

/// How one connection ended.
enum Ended {
    /// Shut down, or the consumer went away: stop.
    Stop,
    /// Lost after listening: connect again at once.
    Dropped,
    /// Could not connect or listen: wait before trying again.
    Failed,
}

impl<T> ListenTask<T>
where
    T: MakeTlsConnect<Socket> + Clone + Send + Sync + 'static,
    T::Stream: Send + 'static,
    T::TlsConnect: Send,
    <T::TlsConnect as TlsConnect<Socket>>::Future: Send,
{
    async fn run(self) {
        let mut backoff = RECONNECT_FIRST;
        loop {
            match self.connection().await {
                Ended::Stop => return,
                Ended::Dropped => backoff = RECONNECT_FIRST,
                Ended::Failed => {
                    tokio::select! {
                        () = self.token.cancelled() => return,
                        () = tokio::time::sleep(backoff) => {}
                    }
                    backoff = (backoff * 2).min(RECONNECT_MAX);
                }
            }
        }
    }

    /// One connection, from connecting to its end.
    async fn connection(&self) -> Ended {
        let connecting = tokio::select! {
            () = self.token.cancelled() => return Ended::Stop,
            c = self.pg.connect(self.tls.clone()) => c,
        };
        let (client, mut connection) = match connecting {
            Ok(pair) => pair,
            Err(e) => {
                tracing::warn!(error = %super::ClusterError::from(e), "listener could not connect");
                return Ended::Failed;
            }
        };
        let mut messages = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
        // Set once the consumer was told to resync: a connection lost after
        // that is replaced at once, one lost before it counts as a failure.
        let listened = AtomicBool::new(false);
        // Listens, says so, then checks the connection now and then; it only
        // ends when that fails. The messages are polled beside it, which is
        // what makes its statements progress.
        let work = async {
            if let Err(e) = client.batch_execute(&self.listen).await {
                tracing::warn!(error = %super::ClusterError::from(e), "listener could not listen");
                return Ended::Failed;
            }
            tracing::debug!("listener listening");
            if !self.deliver(Notice::Resync).await {
                return Ended::Stop;
            }
            listened.store(true, Ordering::Relaxed);
            loop {
                tokio::time::sleep(PING_EVERY).await;
                match tokio::time::timeout(PING_TIMEOUT, client.simple_query("SELECT 1")).await {
                    Ok(Ok(_)) => {}
                    Ok(Err(e)) => {
                        tracing::warn!(error = %super::ClusterError::from(e), "listener connection lost");
                        return Ended::Dropped;
                    }
                    Err(_) => {
                        tracing::warn!("listener connection stopped answering");
                        return Ended::Dropped;
                    }
                }
            }
        };
        tokio::pin!(work);
        let lost = || if listened.load(Ordering::Relaxed) { Ended::Dropped } else { Ended::Failed };
        loop {
            tokio::select! {
                () = self.token.cancelled() => return Ended::Stop,
                ended = &mut work => return ended,
                message = messages.next() => match message {
                    Some(Ok(AsyncMessage::Notification(n))) => {
                        let Some(topic) = Topic::from_channel(n.channel()) else { continue };
                        let notice = Notice::Notified { topic, payload: n.payload().to_owned() };
                        if !self.deliver(notice).await {
                            return Ended::Stop;
                        }
                    }
                    Some(Ok(_)) => {}
                    Some(Err(e)) => {
                        tracing::warn!(error = %super::ClusterError::from(e), "listener connection lost");
                        return lost();
                    }
                    None => {
                        tracing::warn!("listener connection closed");
                        return lost();
                    }
                },
            }
        }
    }

    /// Hands `notice` to the consumer; false when it is gone or on shutdown.
    async fn deliver(&self, notice: Notice) -> bool {
        tokio::select! {
            () = self.token.cancelled() => false,
            sent = self.tx.send(notice) => sent.is_ok(),
        }
    }
}
