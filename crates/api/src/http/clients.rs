//! What one client of a listener may do: connections held open at once, and a
//! token bucket of requests.
//!
//! A client is its peer address, an IPv4 address or the /64 of an IPv6 address.
//! A client's entry lives while it holds a connection and, after its last one
//! closed, until its bucket has refilled, so reconnecting does not reset a
//! drained bucket. The table is swept when it doubles; past [`MAX_CLIENTS`] the
//! entries of clients without connections are forgotten first, so memory stays
//! bounded whatever the number of addresses.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use lemon_core::net::{canonical, mask};
use tokio::time::Instant;

use super::ClientLimits;

/// The most clients one listener tracks; see the module documentation.
const MAX_CLIENTS: usize = 100_000;

/// The table size below which it is never swept.
const FIRST_SWEEP: usize = 1024;

/// The per-client limits of one listener and what each client is using.
#[derive(Debug)]
pub(super) struct Clients {
    limits: ClientLimits,
    table: Mutex<Table>,
}

#[derive(Debug)]
struct Table {
    clients: HashMap<IpAddr, Client>,
    /// The size at which the table is next swept.
    next_sweep: usize,
}

#[derive(Debug, Clone, Copy)]
struct Client {
    connections: usize,
    /// Requests the client may still send at once.
    tokens: f64,
    /// When `tokens` was last brought up to date.
    updated: Instant,
}

/// Why a client was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Refusal {
    /// It already holds its share of connections.
    Connections,
    /// It sent more requests than its rate; it may send one again after this.
    Rate(Duration),
}

impl Refusal {
    /// `Retry-After` in whole seconds, at least 1.
    pub(super) fn retry_after_secs(self) -> u64 {
        match self {
            Refusal::Connections => 1,
            Refusal::Rate(wait) => {
                let secs = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
                secs.max(1)
            }
        }
    }

    /// What the client is told.
    pub(super) fn message(self) -> String {
        match self {
            Refusal::Connections => {
                "too many open connections from this address; close one and retry".to_owned()
            }
            Refusal::Rate(_) => format!(
                "too many requests from this address; retry in {} s",
                self.retry_after_secs()
            ),
        }
    }
}

/// A connection counted against its client until it is dropped.
#[derive(Debug)]
pub(super) struct ClientConnection {
    clients: Arc<Clients>,
    /// `None`: the client is exempt.
    key: Option<IpAddr>,
}

impl ClientConnection {
    /// Takes one request from the client's bucket.
    ///
    /// # Errors
    /// [`Refusal::Rate`] when the bucket is empty.
    pub(super) fn request(&self) -> Result<(), Refusal> {
        match self.key {
            Some(key) => self.clients.request(key, Instant::now()),
            None => Ok(()),
        }
    }
}

impl Drop for ClientConnection {
    fn drop(&mut self) {
        if let Some(key) = self.key {
            self.clients.disconnect(key, Instant::now());
        }
    }
}

impl Clients {
    /// The table of a listener with `limits`; `None` when no limit is on.
    pub(super) fn new(limits: ClientLimits) -> Option<Arc<Clients>> {
        limits.is_active().then(|| {
            Arc::new(Clients {
                limits,
                table: Mutex::new(Table { clients: HashMap::new(), next_sweep: FIRST_SWEEP }),
            })
        })
    }

    /// Counts a new connection from `peer`.
    ///
    /// # Errors
    /// [`Refusal::Connections`] when the client already holds its share.
    pub(super) fn connect(self: &Arc<Self>, peer: IpAddr) -> Result<ClientConnection, Refusal> {
        let Some(key) = self.key(peer) else {
            return Ok(ClientConnection { clients: self.clone(), key: None });
        };
        let now = Instant::now();
        let mut table = self.lock();
        self.make_room(&mut table, now);
        let burst = f64::from(self.limits.burst.max(1));
        let client = table.clients.entry(key).or_insert(Client {
            connections: 0,
            tokens: burst,
            updated: now,
        });
        if self.limits.max_connections > 0 && client.connections >= self.limits.max_connections {
            return Err(Refusal::Connections);
        }
        client.connections += 1;
        Ok(ClientConnection { clients: self.clone(), key: Some(key) })
    }

    /// The client `peer` belongs to; `None` when it is exempt.
    fn key(&self, peer: IpAddr) -> Option<IpAddr> {
        let ip = canonical(peer);
        if self.limits.exempt.iter().any(|network| network.contains(ip)) {
            return None;
        }
        Some(if ip.is_ipv6() { mask(ip, 64) } else { ip })
    }

    fn request(&self, key: IpAddr, now: Instant) -> Result<(), Refusal> {
        let rate = self.limits.requests_per_second;
        if rate == 0 {
            return Ok(());
        }
        let mut table = self.lock();
        let Some(client) = table.clients.get_mut(&key) else { return Ok(()) };
        self.refill(client, now);
        if client.tokens >= 1.0 {
            client.tokens -= 1.0;
            return Ok(());
        }
        let wait = (1.0 - client.tokens) / f64::from(rate);
        Err(Refusal::Rate(Duration::from_secs_f64(wait)))
    }

    fn disconnect(&self, key: IpAddr, now: Instant) {
        let mut table = self.lock();
        let Some(client) = table.clients.get_mut(&key) else { return };
        client.connections = client.connections.saturating_sub(1);
        if client.connections == 0 && self.is_refilled(client, now) {
            table.clients.remove(&key);
        }
    }

    /// Brings the client's bucket up to `now`.
    fn refill(&self, client: &mut Client, now: Instant) {
        let burst = f64::from(self.limits.burst.max(1));
        let elapsed = now.saturating_duration_since(client.updated).as_secs_f64();
        let rate = f64::from(self.limits.requests_per_second);
        client.tokens = (client.tokens + elapsed * rate).min(burst);
        client.updated = now;
    }

    /// Whether the client's bucket is full by `now` (always, without a rate).
    fn is_refilled(&self, client: &Client, now: Instant) -> bool {
        let rate = f64::from(self.limits.requests_per_second);
        if rate == 0.0 {
            return true;
        }
        let burst = f64::from(self.limits.burst.max(1));
        let elapsed = now.saturating_duration_since(client.updated).as_secs_f64();
        client.tokens + elapsed * rate >= burst
    }

    /// Sweeps the table once it has doubled since the last sweep, and forgets
    /// clients without connections when it is full.
    fn make_room(&self, table: &mut Table, now: Instant) {
        if table.clients.len() < table.next_sweep && table.clients.len() < MAX_CLIENTS {
            return;
        }
        table.clients.retain(|_, client| client.connections > 0 || !self.is_refilled(client, now));
        if table.clients.len() >= MAX_CLIENTS {
            table.clients.retain(|_, client| client.connections > 0);
        }
        table.next_sweep = (table.clients.len() * 2).max(FIRST_SWEEP);
    }

    fn lock(&self) -> MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(PoisonError::into_inner)
    }

    #[cfg(test)]
    fn tracked(&self) -> usize {
        self.lock().clients.len()
    }
}

#[cfg(test)]
mod tests {
    use lemon_core::net::Network;

    use super::*;

    fn limits(max_connections: usize, rate: u32, burst: u32) -> ClientLimits {
        ClientLimits {
            max_connections,
            requests_per_second: rate,
            burst,
            exempt: vec![Network::parse("127.0.0.0/8").unwrap()],
        }
    }

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    #[test]
    fn no_limit_means_no_table() {
        assert!(Clients::new(limits(0, 0, 0)).is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn a_client_gets_its_burst_then_its_rate() {
        let clients = Clients::new(limits(0, 2, 3)).unwrap();
        let connection = clients.connect(ip("203.0.113.1")).unwrap();
        for _ in 0..3 {
            connection.request().unwrap();
        }
        let refusal = connection.request().unwrap_err();
        assert_eq!(refusal, Refusal::Rate(Duration::from_millis(500)));
        assert_eq!(refusal.retry_after_secs(), 1);
        assert!(refusal.message().contains("retry in 1 s"), "{}", refusal.message());
        // Another client is not affected.
        let other = clients.connect(ip("203.0.113.2")).unwrap();
        other.request().unwrap();
        tokio::time::advance(Duration::from_millis(500)).await;
        connection.request().unwrap();
        assert!(connection.request().is_err());
    }

    #[tokio::test(start_paused = true)]
    async fn a_slow_rate_asks_for_whole_seconds() {
        let clients = Clients::new(limits(0, 1, 1)).unwrap();
        let connection = clients.connect(ip("198.51.100.7")).unwrap();
        connection.request().unwrap();
        tokio::time::advance(Duration::from_millis(100)).await;
        let refusal = connection.request().unwrap_err();
        assert_eq!(refusal, Refusal::Rate(Duration::from_millis(900)));
        assert_eq!(refusal.retry_after_secs(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn reconnecting_does_not_refill_the_bucket() {
        let clients = Clients::new(limits(0, 1, 2)).unwrap();
        let first = clients.connect(ip("203.0.113.9")).unwrap();
        first.request().unwrap();
        first.request().unwrap();
        drop(first);
        let second = clients.connect(ip("203.0.113.9")).unwrap();
        assert!(second.request().is_err(), "the drained bucket was kept");
        drop(second);
        tokio::time::advance(Duration::from_secs(2)).await;
        let third = clients.connect(ip("203.0.113.9")).unwrap();
        third.request().unwrap();
        third.request().unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn connections_are_capped_per_client_and_returned_on_drop() {
        let clients = Clients::new(limits(2, 0, 0)).unwrap();
        let a = clients.connect(ip("192.0.2.1")).unwrap();
        let _b = clients.connect(ip("192.0.2.1")).unwrap();
        assert_eq!(clients.connect(ip("192.0.2.1")).unwrap_err(), Refusal::Connections);
        assert_eq!(Refusal::Connections.retry_after_secs(), 1);
        let _c = clients.connect(ip("192.0.2.2")).unwrap();
        drop(a);
        let _d = clients.connect(ip("192.0.2.1")).unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn exempt_networks_pass_everything() {
        let clients = Clients::new(limits(1, 1, 1)).unwrap();
        let held: Vec<_> = (0..5).map(|_| clients.connect(ip("127.0.0.1")).unwrap()).collect();
        for _ in 0..10 {
            held[0].request().unwrap();
        }
        let mapped = clients.connect(ip("::ffff:127.0.0.5")).unwrap();
        mapped.request().unwrap();
        assert_eq!(clients.tracked(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn an_ipv6_client_is_its_slash_64() {
        let clients = Clients::new(limits(1, 0, 0)).unwrap();
        let _held = clients.connect(ip("2001:db8:1:2::1")).unwrap();
        let refusal = clients.connect(ip("2001:db8:1:2:ffff::9")).unwrap_err();
        assert_eq!(refusal, Refusal::Connections);
        let _other = clients.connect(ip("2001:db8:1:3::1")).unwrap();
        let v4_mapped = clients.connect(ip("::ffff:192.0.2.1")).unwrap();
        assert_eq!(clients.connect(ip("192.0.2.1")).unwrap_err(), Refusal::Connections);
        drop(v4_mapped);
    }

    #[tokio::test(start_paused = true)]
    async fn the_table_forgets_refilled_clients_and_stays_bounded() {
        let clients = Clients::new(limits(0, 10, 10)).unwrap();
        for i in 0..5000u32 {
            let connection = clients.connect(IpAddr::V4((0x0a00_0000 + i).into())).unwrap();
            connection.request().unwrap();
        }
        // Every client's bucket still owes a token: all are kept.
        assert_eq!(clients.tracked(), 5000);
        tokio::time::advance(Duration::from_secs(1)).await;
        // Refilled and without connections: swept when the table has doubled
        // (at 8 192), while the newer clients still owe their token.
        for i in 0..3500u32 {
            let connection = clients.connect(IpAddr::V4((0x0b00_0000 + i).into())).unwrap();
            connection.request().unwrap();
        }
        assert_eq!(clients.tracked(), 3500);
        let mut held = Vec::new();
        for i in 0..(MAX_CLIENTS as u32 + 10) {
            let connection = clients.connect(IpAddr::V4((0x0c00_0000 + i).into())).unwrap();
            let _ = connection.request();
            if i % 1000 == 0 {
                held.push(connection);
            }
        }
        assert!(clients.tracked() <= MAX_CLIENTS, "{} tracked", clients.tracked());
        // Clients holding connections are never forgotten.
        let lock = clients.lock();
        for connection in &held {
            assert!(lock.clients.contains_key(&connection.key.unwrap()));
        }
    }
}
