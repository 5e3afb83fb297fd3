//! Single-consumer channels owned through channel leases.
//!
//! Some channels take their messages over one connection an account may have
//! only once: Telegram's long polling, Discord's gateway connection, an IMAP
//! mailbox's IDLE, the XMTP bridge. In a cluster exactly one node runs each,
//! the one holding the channel's lease (`<transport>:<account>`, such as
//! `telegram:mybot`). [`ClusterNode::own_channel`] competes for the lease,
//! runs the channel while it holds it, stops it as soon as the lease is lost
//! or the node is fenced, and competes again; so when the owner dies its
//! channel moves to another node about one lease term later.

use std::sync::Arc;

use futures::future::BoxFuture;
use tokio::sync::broadcast::error::RecvError;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::ClusterNode;
use crate::cluster::{Lease, LeaseKind};

/// Why a channel stopped running here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ended {
    /// Shutdown: give the lease up so another node takes it at once.
    Shutdown,
    /// The node is fenced: it writes nothing more, not even a release.
    Fenced,
    /// A renewal found the lease lapsed or taken over.
    Lost,
    /// The channel stopped on its own (it failed): give the lease up, so a
    /// node where it works may take it, and compete again after a while.
    Returned,
}

impl ClusterNode {
    /// Runs channel `name` on this node whenever it holds the channel's lease,
    /// until `token` is cancelled or the node is fenced. `start` is called
    /// each time the lease is acquired, with a token that is cancelled when
    /// the channel must stop here; the future it returns should end soon
    /// after. While another node holds the lease this node asks again every
    /// third of the lease term.
    ///
    /// The returned task ends once the channel has stopped here and its lease
    /// is given up (at shutdown) or lost.
    pub fn own_channel<F>(
        self: &Arc<Self>,
        name: impl Into<String>,
        tracker: &TaskTracker,
        token: CancellationToken,
        start: F,
    ) -> JoinHandle<()>
    where
        F: Fn(CancellationToken) -> BoxFuture<'static, ()> + Send + Sync + 'static,
    {
        let node = Arc::clone(self);
        let name = name.into();
        tracker.spawn(async move { node.channel_loop(&name, &token, &start).await })
    }

    async fn channel_loop<F>(&self, name: &str, token: &CancellationToken, start: &F)
    where
        F: Fn(CancellationToken) -> BoxFuture<'static, ()> + Send + Sync + 'static,
    {
        let term = self.settings.term;
        let retry = term / 3;
        let fenced = self.fenced();
        let mut waiting_on = None;
        loop {
            if token.is_cancelled() || fenced.is_cancelled() {
                return;
            }
            // Subscribed before acquiring: a loss reported right after the
            // acquisition is not missed.
            let lost = self.keeper.subscribe_lost();
            // Not raced against the token: a lease acquired but dropped
            // unknown would stay held until it lapses.
            match self.cluster.acquire_channel(name, term).await {
                Ok(Some(lease)) => {
                    tracing::info!(channel = name, epoch = lease.epoch, "channel owned here");
                    waiting_on = None;
                    match self.run_channel(&lease, lost, token, &fenced, start).await {
                        Ended::Fenced => return,
                        Ended::Lost => {
                            tracing::warn!(
                                channel = name,
                                epoch = lease.epoch,
                                "channel lease lost; the channel stopped here"
                            );
                            continue;
                        }
                        Ended::Shutdown | Ended::Returned => {
                            if let Err(error) = self.cluster.release_channel(&lease).await {
                                tracing::debug!(%error, channel = name, "channel lease not released; it lapses");
                            }
                            if token.is_cancelled() {
                                return;
                            }
                            tracing::warn!(
                                channel = name,
                                "channel stopped by itself; lease given up"
                            );
                        }
                    }
                }
                Ok(None) => {
                    let owner = self.cluster.owner_of(LeaseKind::Channel, name).await;
                    let owner = owner.ok().flatten().map(|o| o.node);
                    if owner.is_some() && owner != waiting_on {
                        let node = owner.as_ref().map(ToString::to_string).unwrap_or_default();
                        tracing::info!(channel = name, owner = %node, "channel owned by another node; standing by");
                    }
                    waiting_on = owner;
                }
                Err(error) => {
                    tracing::warn!(%error, channel = name, "could not ask for the channel's lease");
                }
            }
            tokio::select! {
                () = token.cancelled() => return,
                () = fenced.cancelled() => return,
                () = tokio::time::sleep(retry) => {}
            }
        }
    }

    /// Runs the channel under `lease` until it must stop, then waits for it
    /// to stop.
    async fn run_channel<F>(
        &self,
        lease: &Lease,
        mut lost: tokio::sync::broadcast::Receiver<crate::cluster::LostLease>,
        token: &CancellationToken,
        fenced: &CancellationToken,
        start: &F,
    ) -> Ended
    where
        F: Fn(CancellationToken) -> BoxFuture<'static, ()> + Send + Sync + 'static,
    {
        let held = token.child_token();
        let mut running = start(held.clone());
        let ended = loop {
            tokio::select! {
                () = &mut running => break Ended::Returned,
                () = token.cancelled() => break Ended::Shutdown,
                () = fenced.cancelled() => break Ended::Fenced,
                notice = lost.recv() => match notice {
                    Ok(gone) => {
                        if gone.kind == lease.kind && gone.key == lease.key && gone.epoch == lease.epoch {
                            break Ended::Lost;
                        }
                    }
                    // Missed some: ask whether this one is still held.
                    Err(RecvError::Lagged(_)) => {
                        if !self.cluster.holds(lease) {
                            break Ended::Lost;
                        }
                    }
                    // The keeper's sender lives as long as the node: only
                    // shutdown or fencing is left to wait for.
                    Err(RecvError::Closed) => {
                        tokio::select! {
                            () = &mut running => break Ended::Returned,
                            () = token.cancelled() => break Ended::Shutdown,
                            () = fenced.cancelled() => break Ended::Fenced,
                        }
                    }
                },
            }
        };
        held.cancel();
        if ended != Ended::Returned {
            running.await;
        }
        ended
    }
}

#[cfg(test)]
mod tests {
    //! Against the PostgreSQL server `LEMON_TEST_POSTGRES_URL` names; skipped
    //! when it is unset.

    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use futures::FutureExt;
    use tokio::sync::mpsc;

    use super::*;
    use crate::cluster::node::{ClusterSettings, DEFAULT_SWEEP};
    use crate::cluster::{NodeId, NodeInfo};
    use crate::store::postgres::testing::{fresh_database, server_url};
    use crate::store::postgres::{PostgresConfig, PostgresStore};

    /// Short enough that a lapse takes a few seconds.
    const TERM: Duration = Duration::from_millis(1500);
    /// The longest wait for anything here: a lapse plus a retry, with room.
    const PATIENCE: Duration = Duration::from_secs(15);
    const CHANNEL: &str = "telegram:testbot";

    /// What the channel did on which node.
    #[derive(Debug, Clone, PartialEq, Eq)]
    enum Seen {
        Started(&'static str),
        Stopped(&'static str),
    }

    struct Member {
        node: Arc<ClusterNode>,
        /// Stops the node (its keeper: leases are no longer renewed).
        token: CancellationToken,
        tracker: TaskTracker,
        _store: PostgresStore,
    }

    async fn member(url: &str, id: &str) -> Member {
        let store = PostgresStore::connect(PostgresConfig {
            url: url.to_owned(),
            pool_size: 4,
            chat_state_ttl_ms: 60_000,
            exclusive: false,
        })
        .await
        .unwrap();
        let (token, tracker) = (CancellationToken::new(), TaskTracker::new());
        let settings = ClusterSettings {
            node: NodeId::parse(id).unwrap(),
            term: TERM,
            info: NodeInfo {
                version: "test".to_owned(),
                api_base_url: None,
                channels: vec![CHANNEL.to_owned()],
            },
            sweep: DEFAULT_SWEEP,
        };
        let node = ClusterNode::start(&store, settings, &tracker, token.clone()).await.unwrap();
        Member { node, token, tracker, _store: store }
    }

    /// Runs the channel on `member`: reports starts and stops, and counts the
    /// nodes running it at once in `running`, which must never pass 1.
    fn own(
        member: &Member,
        id: &'static str,
        token: CancellationToken,
        seen: mpsc::UnboundedSender<Seen>,
        running: Arc<AtomicUsize>,
    ) -> JoinHandle<()> {
        member.node.own_channel(CHANNEL, &member.tracker, token, move |held| {
            let (seen, running) = (seen.clone(), running.clone());
            async move {
                let others = running.fetch_add(1, Ordering::SeqCst);
                let _ = seen.send(Seen::Started(id));
                assert_eq!(others, 0, "{id} started the channel while another node ran it");
                held.cancelled().await;
                running.fetch_sub(1, Ordering::SeqCst);
                let _ = seen.send(Seen::Stopped(id));
            }
            .boxed()
        })
    }

    async fn next(seen: &mut mpsc::UnboundedReceiver<Seen>) -> Seen {
        match tokio::time::timeout(PATIENCE, seen.recv()).await {
            Ok(Some(event)) => event,
            Ok(None) => panic!("every channel loop ended"),
            Err(_) => panic!("nothing happened to the channel within {PATIENCE:?}"),
        }
    }

    async fn owner(member: &Member) -> (String, bool) {
        let owner = member.node.cluster().owner_of(LeaseKind::Channel, CHANNEL).await.unwrap();
        let owner = owner.expect("the channel was leased");
        (owner.node.to_string(), owner.live)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn one_node_runs_a_channel_and_another_takes_it_when_the_owner_stops() {
        let Some(server) = server_url() else { return };
        let url = fresh_database(&server).await;
        let (a, b) = (member(&url, "node-a").await, member(&url, "node-b").await);
        let running = Arc::new(AtomicUsize::new(0));
        let (tx, mut seen) = mpsc::unbounded_channel();

        // A competes first and wins; B stands by.
        let a_token = CancellationToken::new();
        let a_loop = own(&a, "a", a_token.clone(), tx.clone(), running.clone());
        assert_eq!(next(&mut seen).await, Seen::Started("a"));
        let b_token = CancellationToken::new();
        let b_loop = own(&b, "b", b_token.clone(), tx.clone(), running.clone());
        assert_eq!(owner(&b).await, ("node-a".to_owned(), true));

        // A stops (a shutdown): it stops the channel, gives the lease up, and
        // B takes the channel over at its next attempt.
        a_token.cancel();
        assert_eq!(next(&mut seen).await, Seen::Stopped("a"));
        tokio::time::timeout(PATIENCE, a_loop).await.unwrap().unwrap();
        assert_eq!(next(&mut seen).await, Seen::Started("b"));
        assert_eq!(owner(&a).await, ("node-b".to_owned(), true));

        // B dies without a word (its loop and its keeper stop): its lease
        // lapses after the term and A, back, takes the channel over.
        let a_token = CancellationToken::new();
        let _a_loop = own(&a, "a", a_token.clone(), tx.clone(), running.clone());
        b_loop.abort();
        b.token.cancel();
        // The aborted loop dropped B's channel without a stop report; it is
        // no longer running.
        running.fetch_sub(1, Ordering::SeqCst);
        assert_eq!(owner(&a).await, ("node-b".to_owned(), true), "B's lease holds until it lapses");
        assert_eq!(next(&mut seen).await, Seen::Started("a"));
        assert_eq!(owner(&a).await, ("node-a".to_owned(), true));
        drop(b_token);

        a_token.cancel();
        assert_eq!(next(&mut seen).await, Seen::Stopped("a"));
        a.token.cancel();
        a.tracker.close();
        b.tracker.close();
        a.tracker.wait().await;
        b.tracker.wait().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_channel_stops_as_soon_as_its_lease_is_lost() {
        let Some(server) = server_url() else { return };
        let url = fresh_database(&server).await;
        let a = member(&url, "node-a").await;
        let running = Arc::new(AtomicUsize::new(0));
        let (tx, mut seen) = mpsc::unbounded_channel();
        let token = CancellationToken::new();
        let _loop = own(&a, "a", token.clone(), tx, running);
        assert_eq!(next(&mut seen).await, Seen::Started("a"));

        // Another node takes the lease over (as after a pause longer than
        // the term): A's next renewal finds it lost and A stops the channel.
        let mut client = a.node.cluster().inner.pool.get().await.unwrap();
        let tx_db = client.transaction().await.unwrap();
        tx_db
            .execute(
                "UPDATE channel_leases SET node_id = 'node-z', epoch = epoch + 1,
                    expires_at = clock_timestamp() + interval '1 hour' WHERE channel = $1",
                &[&CHANNEL],
            )
            .await
            .unwrap();
        tx_db.commit().await.unwrap();
        assert_eq!(next(&mut seen).await, Seen::Stopped("a"));
        assert_eq!(owner(&a).await, ("node-z".to_owned(), true));
        assert!(!a.node.is_fenced(), "losing one lease does not fence the node");

        token.cancel();
        a.token.cancel();
        a.tracker.close();
        a.tracker.wait().await;
    }
}
