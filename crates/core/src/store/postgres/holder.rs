//! One gateway per database: the store holds a session-level advisory lock
//! on a connection of its own for as long as it is open, so a second gateway
//! started on the same database (which would recover the same journal and run
//! its requests twice) is refused at connect with who holds it.
//!
//! The lock goes with its connection: should that connection break, the
//! holder connects again and takes the lock back; if another gateway took it
//! in between, it says so in the log at `error` on every try.

use std::time::Duration;

use tokio::sync::watch;
use tokio_postgres::{Client, Config};
use tokio_postgres_rustls::MakeRustlsConnect;

use super::connect;

/// The advisory lock every gateway's store holds (`lemon.1` in ASCII); not
/// the migration lock, which is taken per transaction.
const HOLDER_LOCK: i64 = 0x006c_656d_6f6e_2e31;

/// How long the holder waits before connecting again after its connection broke.
const RETRY: Duration = Duration::from_secs(1);

/// The lock, held on a connection driven by a task of its own; dropping it
/// ends the task, closing the connection, which frees the lock.
pub(super) struct Holder {
    stop: watch::Sender<bool>,
}

impl Drop for Holder {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
    }
}

/// Who holds the lock now, as far as the server knows: its address and
/// since when, for the error a second gateway gets.
async fn holder_of(client: &Client) -> String {
    let row = client
        .query_opt(
            "SELECT coalesce(host(a.client_addr), 'a local socket'), \
                    date_trunc('second', a.backend_start)::text \
             FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid \
             WHERE l.locktype = 'advisory' AND l.granted \
               AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
               AND l.classid = ($1::bigint >> 32)::oid \
               AND l.objid = ($1::bigint & 4294967295)::oid \
             LIMIT 1",
            &[&HOLDER_LOCK],
        )
        .await;
    match row {
        Ok(Some(row)) => {
            let from: String = row.get(0);
            let since: String = row.get(1);
            format!("connected from {from} since {since}")
        }
        _ => "holder unknown".to_owned(),
    }
}

/// A connection holding the lock: the client, and its driver's task, which
/// ends when the connection does.
type Held = (Client, tokio::task::JoinHandle<()>);

/// Connects and tries the lock once: the connection holding it, or why not.
async fn try_hold(config: &Config, tls: &MakeRustlsConnect) -> Result<Held, String> {
    let (client, connection) =
        config.connect(tls.clone()).await.map_err(|e| connect::error_text(&e))?;
    let driver = tokio::spawn(async move {
        let _ = connection.await;
    });
    let held: bool = client
        .query_one("SELECT pg_try_advisory_lock($1)", &[&HOLDER_LOCK])
        .await
        .map_err(|e| connect::error_text(&e))?
        .get(0);
    if held {
        return Ok((client, driver));
    }
    let who = holder_of(&client).await;
    drop(client);
    let _ = driver.await;
    Err(format!(
        "another gateway uses this database ({who}); stop it, or give this one a database of its own"
    ))
}

impl Holder {
    /// Takes the lock, or says who holds it.
    ///
    /// # Errors
    /// The server cannot be reached, or another gateway holds the lock.
    pub(super) async fn take(config: Config, target: String) -> Result<Holder, String> {
        let tls = connect::tls();
        let held = try_hold(&config, &tls).await?;
        let (stop, mut stopped) = watch::channel(false);
        tokio::spawn(async move {
            // The client stays alive with its driver: dropping it would close
            // the connection and free the lock.
            let (mut _client, mut driver) = held;
            loop {
                tokio::select! {
                    _ = stopped.changed() => return,
                    _ = &mut driver => {}
                }
                // The connection broke: take the lock back on a new one.
                loop {
                    tokio::select! {
                        _ = stopped.changed() => return,
                        () = tokio::time::sleep(RETRY) => {}
                    }
                    match try_hold(&config, &tls).await {
                        Ok(again) => {
                            tracing::info!(target = %target, "store lock taken again");
                            (_client, driver) = again;
                            break;
                        }
                        Err(why) => tracing::error!(target = %target, "store lock lost: {why}"),
                    }
                }
            }
        });
        Ok(Holder { stop })
    }
}
