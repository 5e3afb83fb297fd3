//! `[gateway.cluster]`: this gateway as one node of several sharing a
//! PostgreSQL store.
//!
//! What the server adds to a node: joining the cluster at start (its id, its
//! lease term, what it tells the others), the cluster config put over the
//! file at start and followed afterwards (`follow_config`), the cap of
//! concurrent runs as the cluster's slot count, the single-consumer channels
//! run only where their channel lease is held (`Leased`), and the
//! process-group records kept per machine and home, since another node's
//! processes are not this one's to kill.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use lemon_core::cluster::node::DEFAULT_SWEEP;
use lemon_core::cluster::{ClusterNode, ClusterSettings, NodeInfo, Notice, SharedConfig, Topic};
use lemon_core::config::{ConfigError, GatewayConfig, SharedSettings};
use lemon_core::store::postgres::PostgresStore;
use lemon_core::transport::{Transport, TransportContext, TransportError, TransportState};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// The exit code of a gateway stopped because its node was fenced: a
/// temporary failure (`EX_TEMPFAIL`), for a supervisor to start it again.
pub const FENCED_EXIT_CODE: u8 = 75;

/// The lease of the node that fires scheduled prompts (`[[gateway.cron]]` and
/// jobs made through the API or the `cron` tool): one node at a time.
pub const CRON_LEASE: &str = "cron";

/// The single-consumer channel a transport of `config` reads from, as
/// `<transport>:<account>`; `None` for a transport every node runs (webhooks,
/// SMS, voice, an email inbox without IMAP) or one that is switched off.
pub(crate) fn channel_name(config: &GatewayConfig, transport: &str) -> Option<String> {
    use lemon_transports::{discord, email, telegram, xmtp};
    match transport {
        telegram::inbound::TRANSPORT_ID => {
            let section = config.telegram.as_ref();
            if !lemon_core::transport::enabled(config.enable_telegram, section) {
                return None;
            }
            let parsed = section
                .and_then(|s| telegram::config::TelegramConfig::parse_values(s).ok())
                .map(|(c, _)| c);
            let account = parsed.and_then(|c| {
                c.bot_username
                    .map(|name| name.trim_start_matches('@').to_ascii_lowercase())
                    .filter(|name| !name.is_empty())
                    .or_else(|| c.bot_id.map(|id| id.to_string()))
                    .or(c.account_id)
            });
            Some(format!("telegram:{}", account.unwrap_or_else(|| "default".to_owned())))
        }
        discord::inbound::TRANSPORT_ID => {
            let section = config.discord.as_ref();
            if !lemon_core::transport::enabled(config.enable_discord, section) {
                return None;
            }
            let application = section
                .and_then(|s| discord::config::DiscordConfig::parse_values(s).ok())
                .and_then(|(c, _)| c.application_id);
            Some(format!(
                "discord:{}",
                application.map_or_else(|| "default".to_owned(), |id| id.0.to_string())
            ))
        }
        email::TRANSPORT_ID => {
            let (parsed, _) = config
                .email
                .as_ref()
                .and_then(|s| email::config::EmailConfig::parse_values(s).ok())?;
            let imap = parsed.imap?;
            Some(format!("email:{}@{}/{}", imap.username, imap.host, imap.folder))
        }
        xmtp::TRANSPORT_ID => {
            let section = config.xmtp.as_ref();
            if !lemon_core::transport::enabled(config.enable_xmtp, section) {
                return None;
            }
            let (parsed, _) =
                section.and_then(|s| xmtp::config::XmtpConfig::parse_values(s).ok())?;
            Some(format!("xmtp:{}:{}", parsed.env.as_str(), parsed.wallet_key_secret))
        }
        _ => None,
    }
}

/// Every single-consumer channel `config` enables: what this node could own.
pub(crate) fn channel_names(config: &GatewayConfig) -> Vec<String> {
    use lemon_transports::{discord, email, telegram, xmtp};
    [telegram::inbound::TRANSPORT_ID, discord::inbound::TRANSPORT_ID, email::TRANSPORT_ID]
        .into_iter()
        .chain([xmtp::TRANSPORT_ID])
        .filter_map(|id| channel_name(config, id))
        .collect()
}

/// A node that joined: the node, and the cluster config as it was read at
/// start (its row, and the body checked alone).
pub(crate) struct Joined {
    pub(crate) node: Arc<ClusterNode>,
    pub(crate) row: SharedConfig,
    /// Why the row's body is refused here: the file alone is in force
    /// until a version this node takes.
    pub(crate) shared: Result<SharedSettings, String>,
}

/// Joins the cluster of `store`'s database as `[gateway.cluster]` says, puts
/// the cluster config over `config` (the node's file), and makes the
/// cluster's slot count the resulting `max_concurrent_runs` (nodes that
/// disagree, where the cluster config does not set it: the last one to start
/// decides).
///
/// # Errors
/// `node_id` is not an id, or the node could not register, read the cluster
/// config or set the slots.
pub(crate) async fn join(
    config: &mut GatewayConfig,
    store: &PostgresStore,
    tracker: &TaskTracker,
    token: CancellationToken,
) -> anyhow::Result<Joined> {
    let cluster = &config.cluster;
    let node = cluster.node().map_err(|e| anyhow::anyhow!("[gateway.cluster] node_id: {e}"))?;
    let settings = ClusterSettings {
        node,
        term: cluster.lease_term(),
        info: NodeInfo {
            version: env!("CARGO_PKG_VERSION").to_owned(),
            api_base_url: cluster.api_base_url.clone(),
            channels: channel_names(config),
        },
        sweep: DEFAULT_SWEEP,
    };
    let node = ClusterNode::start(store, settings, tracker, token)
        .await
        .map_err(|e| anyhow::anyhow!("could not join the cluster: {e}"))?;
    let row = node
        .cluster()
        .config()
        .await
        .map_err(|e| anyhow::anyhow!("could not read the cluster config: {e}"))?;
    let shared = match SharedSettings::parse(row.version, &row.body) {
        Ok(shared) => {
            shared.apply(config);
            if !shared.keys().is_empty() {
                tracing::info!(version = row.version, keys = %shared.keys().join(", "), "cluster config over config.toml");
            }
            Ok(shared)
        }
        Err(error) => {
            tracing::error!(version = row.version, %error, "cluster config refused on this node; config.toml alone is in force");
            Err(error.to_string())
        }
    };
    let slots = u32::try_from(config.max_concurrent_runs).unwrap_or(u32::MAX);
    node.cluster()
        .set_slot_count(slots)
        .await
        .map_err(|e| anyhow::anyhow!("could not set the cluster's run slots: {e}"))?;
    tracing::info!(node = %node.id(), slots, "cluster node started; the cluster runs at most {slots} runs at once");
    Ok(Joined { node, row, shared })
}

/// Follows the cluster config until `token` is cancelled: its row is read
/// again on every `Topic::Config` notification, whenever notifications may
/// have been missed (a resync, a receiver that lagged), and every sweep in
/// case one was lost, and sent on `rows` when its version changed.
pub(crate) fn follow_config(
    node: Arc<ClusterNode>,
    rows: tokio::sync::watch::Sender<Option<SharedConfig>>,
    tracker: &TaskTracker,
    token: CancellationToken,
) {
    use tokio::sync::broadcast::error::RecvError;
    tracker.spawn(async move {
        let mut notices = Some(node.subscribe());
        let mut sweep = tokio::time::interval(node.settings().sweep);
        sweep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let known = |rows: &tokio::sync::watch::Sender<Option<SharedConfig>>| {
            rows.borrow().as_ref().map_or(-1, |row| row.version)
        };
        loop {
            tokio::select! {
                () = token.cancelled() => return,
                notice = next_notice(notices.as_mut()) => match notice {
                    Ok(Notice::Notified { topic: Topic::Config, payload }) => {
                        if payload.trim().parse::<i64>().ok() == Some(known(&rows)) {
                            continue;
                        }
                    }
                    Ok(Notice::Resync) | Err(RecvError::Lagged(_)) => {}
                    Ok(Notice::Notified { .. }) => continue,
                    // The sweep alone from now on.
                    Err(RecvError::Closed) => {
                        notices = None;
                        continue;
                    }
                },
                _ = sweep.tick() => {}
            }
            match node.cluster().config().await {
                Ok(row) => {
                    rows.send_if_modified(|seen| {
                        let changed = seen.as_ref().is_none_or(|s| s.version != row.version);
                        if changed {
                            tracing::debug!(version = row.version, "cluster config changed");
                            *seen = Some(row);
                        }
                        changed
                    });
                }
                Err(error) => tracing::debug!(%error, "cluster config not read; trying again"),
            }
        }
    });
}

async fn next_notice(
    notices: Option<&mut tokio::sync::broadcast::Receiver<Notice>>,
) -> Result<Notice, tokio::sync::broadcast::error::RecvError> {
    match notices {
        Some(notices) => notices.recv().await,
        None => std::future::pending().await,
    }
}

/// Checks bodies for `PUT /v1/cluster/config` on the reload path, over the
/// config in force there.
#[derive(Debug, Clone)]
pub(crate) struct SharedChecker {
    pub(crate) requests: tokio::sync::mpsc::Sender<crate::reload::CheckRequest>,
}

#[async_trait::async_trait]
impl lemon_api::cluster::SharedConfigCheck for SharedChecker {
    async fn check(&self, body: &str) -> Result<(), ConfigError> {
        let (reply, answer) = tokio::sync::oneshot::channel();
        let request = crate::reload::CheckRequest { body: body.to_owned(), reply };
        let stopped = || ConfigError::Invalid {
            path: lemon_core::config::SHARED_SOURCE.into(),
            at: None,
            key: String::new(),
            message: "the gateway is stopping; nothing was checked".to_owned(),
        };
        self.requests.send(request).await.map_err(|_| stopped())?;
        answer.await.map_err(|_| stopped())?
    }
}

/// Where this gateway keeps its process-group records: one namespace per
/// machine and home in cluster mode, where the store is shared, so a node
/// kills only the leftovers of an earlier gateway of its own.
pub(crate) fn process_namespace(clustered: bool, home: &std::path::Path) -> Arc<str> {
    let base = lemon_core::store::PROCESS_GROUPS_NAMESPACE;
    if !clustered {
        return base.into();
    }
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_default();
    format!("{base}@{host}:{}", home.display()).into()
}

/// A single-consumer transport of a cluster node: it runs only while this
/// node holds its channel's lease, and stands by otherwise.
pub(crate) struct Leased {
    inner: Arc<dyn Transport>,
    channel: String,
    node: Arc<ClusterNode>,
}

impl fmt::Debug for Leased {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Leased")
            .field("transport", &self.inner.id())
            .field("channel", &self.channel)
            .finish_non_exhaustive()
    }
}

/// `transport` as a node of `cluster` runs it: under its channel lease when
/// it reads from a single-consumer channel, as it is otherwise.
pub(crate) fn leased(
    config: &GatewayConfig,
    transport: Arc<dyn Transport>,
    cluster: Option<&Arc<ClusterNode>>,
) -> Arc<dyn Transport> {
    let Some(node) = cluster else { return transport };
    match channel_name(config, transport.id()) {
        Some(channel) => Arc::new(Leased { inner: transport, channel, node: node.clone() }),
        None => transport,
    }
}

/// What a standing-by transport's status says.
fn standby(channel: &str) -> TransportState {
    TransportState::Running { detail: Some(format!("standby; {channel} runs on another node")) }
}

#[async_trait::async_trait]
impl Transport for Leased {
    fn id(&self) -> &str {
        self.inner.id()
    }

    /// Competes for the channel until shutdown, running the transport while
    /// this node owns it. A failure of the transport gives the lease up and
    /// is returned, so the supervisor retries (and another node may take
    /// the channel meanwhile).
    async fn run(&self, ctx: TransportContext) -> Result<(), TransportError> {
        let stop = ctx.shutdown.child_token();
        let (failed_tx, mut failed_rx) = tokio::sync::mpsc::channel::<TransportError>(1);
        ctx.status.set(standby(&self.channel));
        let (inner, base, channel) = (self.inner.clone(), ctx.clone(), self.channel.clone());
        let start = move |held: CancellationToken| {
            let (inner, failed, channel) = (inner.clone(), failed_tx.clone(), channel.clone());
            let ctx = TransportContext { shutdown: held.clone(), ..base.clone() };
            let status = ctx.status.clone();
            Box::pin(async move {
                status.set(TransportState::Starting);
                let outcome = inner.run(ctx).await;
                if held.is_cancelled() {
                    status.set(standby(&channel));
                    return;
                }
                let error = match outcome {
                    Ok(()) => TransportError::retryable("stopped without an error"),
                    Err(error) => error,
                };
                let _ = failed.try_send(error);
            }) as Pin<Box<dyn Future<Output = ()> + Send>>
        };
        let mut owning =
            self.node.own_channel(self.channel.clone(), &ctx.tracker, stop.clone(), start);
        let fenced = self.node.fenced();
        let result = tokio::select! {
            () = ctx.shutdown.cancelled() => Ok(()),
            Some(error) = failed_rx.recv() => Err(error),
            () = fenced.cancelled() => Err(TransportError::fatal("this cluster node is fenced")),
            joined = &mut owning => {
                let why = match joined {
                    Err(error) if error.is_panic() => "the channel panicked",
                    _ => "the channel's lease loop ended",
                };
                return Err(TransportError::retryable(why));
            }
        };
        // Stopped here and its lease given up before the supervisor goes on:
        // a restart never runs two copies.
        stop.cancel();
        let _ = owning.await;
        result
    }
}

/// The cluster as `doctor` sees it, read without joining it: no lease is
/// taken and nothing is registered.
#[derive(Debug, Clone)]
pub struct Inspection {
    /// Every registered node, oldest first; alive when it heartbeat within
    /// the lease term of `[gateway.cluster]`.
    pub nodes: Vec<lemon_core::cluster::NodeStatus>,
    /// The lease term of `[gateway.cluster]`.
    pub term: std::time::Duration,
}

/// Reads the cluster of the store `config` names.
///
/// # Errors
/// The database cannot be reached or read, or its secret is unset.
pub async fn inspect(
    config: &GatewayConfig,
    secrets: &lemon_core::secrets::SecretStore,
) -> anyhow::Result<Inspection> {
    let (postgres, _) = crate::open_postgres(&config.store, secrets, false).await?;
    // Only read with: an id nobody registers.
    let cluster = lemon_core::cluster::Cluster::new(
        postgres.pool().clone(),
        lemon_core::cluster::NodeId::generate(),
    );
    let term = config.cluster.lease_term();
    let nodes = cluster.nodes(term).await;
    let _ = lemon_core::store::StoreHandle::new(postgres).close().await;
    Ok(Inspection { nodes: nodes.map_err(|e| anyhow::anyhow!("{e}"))?, term })
}
