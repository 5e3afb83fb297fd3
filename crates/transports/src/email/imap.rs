//! Mail in by IMAP: select the folder, catch up by UID from the last one
//! handled (kept in the store with the folder's UIDVALIDITY), then IDLE until
//! the server reports news; reconnect with backoff when the connection drops.
//!
//! A mail's UID is saved after it was handed over, and handing the same mail
//! over twice is one run (its run id comes from its `Message-ID`), so a crash
//! between the two repeats nothing and loses nothing.

use std::sync::Arc;
use std::time::Duration;

use async_imap::extensions::idle::IdleResponse;
use async_imap::Session;
use futures::StreamExt;
use lemon_core::store::StoreHandle;
use lemon_core::transport::{StatusHandle, TransportState};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

use super::config::ImapConfig;
use crate::delivery::Backoff;

/// Store namespace of the last UID handled per mailbox.
pub(super) const CURSOR_NS: &str = "email.imap";

/// How long connecting and logging in may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);
/// How long one command may take.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(120);
/// Waits between reconnects.
const RECONNECT: Backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(60));

/// A stream IMAP runs over: TCP, or TLS over TCP.
pub(super) trait ImapStream:
    AsyncRead + AsyncWrite + Unpin + Send + std::fmt::Debug
{
}
impl<T: AsyncRead + AsyncWrite + Unpin + Send + std::fmt::Debug> ImapStream for T {}

type ImapSession = Session<Box<dyn ImapStream>>;

/// Where the watcher is in a mailbox, as stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct Cursor {
    pub(super) uid_validity: u32,
    /// The highest UID handed over.
    pub(super) last_uid: u32,
}

/// What the watcher hands each mail to.
#[async_trait::async_trait]
pub(super) trait Receive: Send + Sync {
    /// Takes one raw mail; returns once it is on record: `true` when its UID
    /// can be saved, `false` when the gateway did not take it now (it is
    /// handed over again after a reconnect).
    async fn receive(self: Arc<Self>, raw: Vec<u8>) -> bool;
}

/// One mailbox watched.
pub(super) struct Watcher {
    pub(super) config: ImapConfig,
    pub(super) password: String,
    pub(super) store: StoreHandle,
    pub(super) status: StatusHandle,
    pub(super) shutdown: CancellationToken,
    pub(super) receiver: Arc<dyn Receive>,
    /// What status shows while watching.
    pub(super) detail: Arc<dyn Fn() -> String + Send + Sync>,
}

impl std::fmt::Debug for Watcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watcher")
            .field("host", &self.config.host)
            .field("folder", &self.config.folder)
            .finish_non_exhaustive()
    }
}

/// Why a session ended.
#[derive(Debug)]
enum SessionEnd {
    Shutdown,
    Failed(String),
    /// Login refused: a config (or password) change is needed, but it is
    /// retried with the longest backoff, since the password may be changed
    /// in the secrets without a config edit.
    LoginRefused(String),
}

impl Watcher {
    fn cursor_key(&self) -> String {
        format!(
            "{}@{}:{}/{}",
            self.config.username.to_ascii_lowercase(),
            self.config.host.to_ascii_lowercase(),
            self.config.port(),
            self.config.folder
        )
    }

    /// Watches until shutdown, reconnecting after every failure.
    pub(super) async fn run(&self) {
        let mut failures = 0u32;
        loop {
            let end = self.session(&mut failures).await;
            let reason = match end {
                SessionEnd::Shutdown => return,
                SessionEnd::Failed(reason) => reason,
                SessionEnd::LoginRefused(reason) => {
                    failures = failures.max(6);
                    reason
                }
            };
            failures += 1;
            let pause = RECONNECT.delay(failures);
            let retry_in_ms = u64::try_from(pause.as_millis()).unwrap_or(u64::MAX);
            tracing::warn!(reason = %reason, retry_in_ms, "imap connection lost");
            self.status.set(TransportState::Failing {
                reason: format!("imap {}: {reason}", self.config.host),
                attempts: failures,
                retry_in_ms: Some(retry_in_ms),
            });
            tokio::select! {
                () = self.shutdown.cancelled() => return,
                () = tokio::time::sleep(pause) => {}
            }
        }
    }

    async fn connect(&self) -> Result<ImapSession, SessionEnd> {
        connect(&self.config, &self.password).await
    }

    /// One connection: log in, select, catch up, IDLE (or poll), until it fails.
    async fn session(&self, failures: &mut u32) -> SessionEnd {
        let connected = tokio::select! {
            () = self.shutdown.cancelled() => return SessionEnd::Shutdown,
            connected = tokio::time::timeout(CONNECT_TIMEOUT, self.connect()) => connected,
        };
        let mut session = match connected {
            Ok(Ok(session)) => session,
            Ok(Err(end)) => return end,
            Err(_) => return SessionEnd::Failed("connecting timed out".into()),
        };
        let idle = self.config.idle
            && match session.capabilities().await {
                Ok(caps) => caps.has_str("IDLE"),
                Err(e) => return SessionEnd::Failed(format!("CAPABILITY failed: {e}")),
            };
        let mailbox = match session.select(&self.config.folder).await {
            Ok(mailbox) => mailbox,
            Err(e) => {
                return SessionEnd::Failed(format!(
                    "cannot select {:?}: {e}",
                    lemon_core::log_text::escape(&self.config.folder)
                ))
            }
        };
        let uid_validity = mailbox.uid_validity.unwrap_or(0);
        let uid_next = mailbox.uid_next.unwrap_or(1);
        let mut cursor = match self.load_cursor(uid_validity, uid_next).await {
            Ok(cursor) => cursor,
            Err(e) => return SessionEnd::Failed(e),
        };
        *failures = 0;
        self.status.running(Some((self.detail)()));
        tracing::info!(host = %self.config.host, folder = %self.config.folder, idle, last_uid = cursor.last_uid, "imap watching");
        loop {
            if let Err(e) = self.catch_up(&mut session, &mut cursor).await {
                return e;
            }
            if idle {
                let mut handle = session.idle();
                if let Err(e) = handle.init().await {
                    return SessionEnd::Failed(format!("IDLE failed: {e}"));
                }
                let (wait, _stop) = handle.wait_with_timeout(self.config.idle_renew());
                let news = tokio::select! {
                    () = self.shutdown.cancelled() => return SessionEnd::Shutdown,
                    news = wait => news,
                };
                match news {
                    Ok(IdleResponse::NewData(_) | IdleResponse::Timeout) => {}
                    Ok(IdleResponse::ManualInterrupt) => {}
                    Err(e) => return SessionEnd::Failed(format!("IDLE failed: {e}")),
                }
                session = match tokio::time::timeout(COMMAND_TIMEOUT, handle.done()).await {
                    Ok(Ok(session)) => session,
                    Ok(Err(e)) => return SessionEnd::Failed(format!("ending IDLE failed: {e}")),
                    Err(_) => return SessionEnd::Failed("ending IDLE timed out".into()),
                };
            } else {
                tokio::select! {
                    () = self.shutdown.cancelled() => return SessionEnd::Shutdown,
                    () = tokio::time::sleep(self.config.poll_interval()) => {}
                }
                if let Err(e) = session.noop().await {
                    return SessionEnd::Failed(format!("NOOP failed: {e}"));
                }
            }
        }
    }

    /// The stored cursor of this mailbox; a first start (or a mailbox whose
    /// UIDVALIDITY changed, so old UIDs mean nothing) starts at the mail that
    /// is there now: only what arrives from now on is answered.
    async fn load_cursor(&self, uid_validity: u32, uid_next: u32) -> Result<Cursor, String> {
        let key = self.cursor_key();
        let stored = self
            .store
            .kv_get(CURSOR_NS, &key, lemon_core::clock::now_ms())
            .await
            .map_err(|e| format!("cannot read the mailbox cursor: {e}"))?
            .and_then(|value| serde_json::from_value::<Cursor>(value).ok());
        match stored {
            Some(cursor) if cursor.uid_validity == uid_validity => Ok(cursor),
            other => {
                if other.is_some() {
                    tracing::warn!(folder = %self.config.folder, "UIDVALIDITY changed; starting from the mail there now");
                }
                let cursor = Cursor { uid_validity, last_uid: uid_next.saturating_sub(1) };
                self.save_cursor(cursor).await;
                Ok(cursor)
            }
        }
    }

    async fn save_cursor(&self, cursor: Cursor) {
        let value = serde_json::to_value(cursor).unwrap_or_default();
        self.store.kv_put(CURSOR_NS, &self.cursor_key(), value, None).await;
        if let Err(error) = self.store.flush().await {
            tracing::warn!(%error, "mailbox cursor not saved");
        }
    }

    /// Hands over every mail after the cursor, in UID order.
    async fn catch_up(
        &self,
        session: &mut ImapSession,
        cursor: &mut Cursor,
    ) -> Result<(), SessionEnd> {
        let query = format!("UID {}:*", cursor.last_uid.saturating_add(1));
        let found = tokio::time::timeout(COMMAND_TIMEOUT, session.uid_search(&query)).await;
        let mut uids: Vec<u32> = match found {
            Ok(Ok(uids)) => uids.into_iter().filter(|uid| *uid > cursor.last_uid).collect(),
            Ok(Err(e)) => return Err(SessionEnd::Failed(format!("UID SEARCH failed: {e}"))),
            Err(_) => return Err(SessionEnd::Failed("UID SEARCH timed out".into())),
        };
        uids.sort_unstable();
        for uid in uids {
            if self.shutdown.is_cancelled() {
                return Err(SessionEnd::Shutdown);
            }
            let raw = match self.fetch(session, uid).await {
                Ok(raw) => raw,
                Err(e) => return Err(SessionEnd::Failed(e)),
            };
            if let Some(raw) = raw {
                if !self.receiver.clone().receive(raw).await {
                    if self.shutdown.is_cancelled() {
                        return Err(SessionEnd::Shutdown);
                    }
                    return Err(SessionEnd::Failed(format!(
                        "the gateway did not take mail {uid}; trying again"
                    )));
                }
            }
            cursor.last_uid = uid;
            self.save_cursor(*cursor).await;
        }
        Ok(())
    }

    /// The raw mail of `uid` (`None`: gone in between), without marking it seen.
    async fn fetch(&self, session: &mut ImapSession, uid: u32) -> Result<Option<Vec<u8>>, String> {
        let fetched = async {
            let mut stream = session
                .uid_fetch(uid.to_string(), "(UID BODY.PEEK[])")
                .await
                .map_err(|e| format!("UID FETCH {uid} failed: {e}"))?;
            let mut raw = None;
            while let Some(item) = stream.next().await {
                let item = item.map_err(|e| format!("UID FETCH {uid} failed: {e}"))?;
                if item.uid == Some(uid) || item.uid.is_none() {
                    if let Some(body) = item.body() {
                        raw = Some(body.to_vec());
                    }
                }
            }
            Ok(raw)
        };
        match tokio::time::timeout(COMMAND_TIMEOUT, fetched).await {
            Ok(result) => result,
            Err(_) => Err(format!("UID FETCH {uid} timed out")),
        }
    }
}

/// Connects to `config`'s server and logs in.
async fn connect(config: &ImapConfig, password: &str) -> Result<ImapSession, SessionEnd> {
    let host = config.host.trim();
    let addr = format!("{host}:{}", config.port());
    let failed =
        |what: &str, e: &dyn std::fmt::Display| SessionEnd::Failed(format!("{what} {addr}: {e}"));
    let tcp = TcpStream::connect(&addr).await.map_err(|e| failed("cannot connect to", &e))?;
    let stream: Box<dyn ImapStream> = if config.tls {
        let mut roots = tokio_rustls::rustls::RootCertStore::empty();
        roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
        if let Some(path) = &config.tls_ca_file {
            let certs = super::config::read_ca_file(path)
                .map_err(|e| SessionEnd::Failed(format!("`imap.tls_ca_file`: {e}")))?;
            for cert in certs {
                roots
                    .add(tokio_rustls::rustls::pki_types::CertificateDer::from(cert))
                    .map_err(|e| failed("a certificate of tls_ca_file for", &e))?;
            }
        }
        let tls = tokio_rustls::rustls::ClientConfig::builder_with_provider(Arc::new(
            tokio_rustls::rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map_err(|e| failed("TLS for", &e))?
        .with_root_certificates(roots)
        .with_no_client_auth();
        let name = tokio_rustls::rustls::pki_types::ServerName::try_from(host.to_owned())
            .map_err(|e| failed("TLS name of", &e))?;
        let connector = tokio_rustls::TlsConnector::from(Arc::new(tls));
        Box::new(connector.connect(name, tcp).await.map_err(|e| failed("TLS with", &e))?)
    } else {
        Box::new(tcp)
    };
    let mut client = async_imap::Client::new(stream);
    // The server speaks first.
    match client.read_response().await {
        Some(Ok(_)) => {}
        Some(Err(e)) => return Err(failed("no greeting from", &e)),
        None => return Err(SessionEnd::Failed(format!("{addr} closed the connection"))),
    }
    client.login(&config.username, password).await.map_err(|(e, _)| {
        SessionEnd::LoginRefused(format!(
            "login as {} refused: {e}",
            lemon_core::log_text::escape(&config.username)
        ))
    })
}

/// What a login to `config`'s server came to, within `timeout`.
pub(super) async fn check_login(
    config: &ImapConfig,
    password: &str,
    timeout: Duration,
) -> Result<String, super::check::Problem> {
    use super::check::Problem;
    match tokio::time::timeout(timeout, connect(config, password)).await {
        Ok(Ok(mut session)) => {
            let _ = tokio::time::timeout(Duration::from_secs(5), session.logout()).await;
            Ok(format!(
                "logged in as {} at {}:{}",
                lemon_core::log_text::escape(&config.username),
                config.host.trim(),
                config.port()
            ))
        }
        Ok(Err(SessionEnd::LoginRefused(why))) => Err(Problem::Refused(why)),
        Ok(Err(SessionEnd::Failed(why))) => Err(Problem::Unreachable(why)),
        Ok(Err(SessionEnd::Shutdown)) => Err(Problem::Unreachable("stopped".into())),
        Err(_) => Err(Problem::Unreachable(format!(
            "{}:{} did not answer within {} s",
            config.host.trim(),
            config.port(),
            timeout.as_secs()
        ))),
    }
}
