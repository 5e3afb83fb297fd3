//! Lemon Gateway core: everything that decides what happens to a message, with no
//! HTTP and no process spawning.
//!
//! # Layout
//! - [`ids`]: run ids, conversation keys, engine ids.
//! - [`engine`]: the contract an engine implements, its events, resume tokens and the
//!   [`engine::EngineRegistry`].
//! - [`bus`]: the typed event bus (per-run topics plus a firehose).
//! - [`gateway`]: the execution runtime: scheduler (slots, per-conversation FIFO),
//!   runs, the engine lock and the [`gateway::GatewayHandle`] callers use.
//! - [`router`]: conversations, queue modes, resume, engine selection, slash
//!   commands and the admission journal; decides what the gateway runs and when.
//!   The way back up: [`router::RunFollower`] follows one run to its completion,
//!   [`router::Runs`] answers reads.
//! - [`store`]: durable state (runs, run events, chat state) in SQLite, or in memory.
//! - [`cluster`]: cluster mode's coordination over the shared PostgreSQL
//!   database: node registry, session and channel leases with fencing epochs,
//!   run slots, control requests, the cluster config row, notifications.
//! - [`config`]: the `config.toml` types and loader.
//! - [`secrets`]: where secret values come from.
//! - [`contain`]: file paths kept inside the directories a run may touch.
//! - [`net`]: which addresses count as private or loopback (webhook callbacks, `fetch`).
//! - [`sms`]: the SMS inbox the `sms_*` tools read verification codes from.
//! - [`cron`]: scheduled prompts: schedules, jobs in the store, the actor that
//!   fires them through the router, the `cron` tool.
//! - [`media`]: files people send with a message: checked, staged, and
//!   placed in the run's uploads directory when it starts.
//! - [`clock`]: wall-clock milliseconds for timestamps.
//! - [`log_text`]: outside text (stderr, engine errors) escaped for a log field.
//! - [`transport`]: the contract every channel implements, the states status
//!   reports, the one enable rule, the [`transport::TransportRegistry`] that
//!   supervises and restarts transports, and the listener settings
//!   ([`transport::listener`]) a listening transport is served with.
//! - [`tool`]: the contract of the tools a native run can call, and the
//!   registry of the gateway's tools.
//! - [`budget`]: the spending check engines make between model turns.
//! - [`approvals`]: the owner's rules over tool calls and the hub where asked
//!   calls wait; [`untrusted`]: the mark and data blocks of outside text.
//! - `testing` (feature `test-util`): a scriptable fake engine and bounded waits.

pub mod approvals;
pub mod artifacts;
pub mod budget;
pub mod bus;
pub mod clock;
pub mod cluster;
pub mod config;
pub mod contain;
pub mod cron;
pub mod engine;
pub mod gateway;
pub mod ids;
pub mod log_text;
pub mod mcp;
pub mod media;
pub mod net;
pub mod router;
pub mod secrets;
pub mod sms;
pub mod store;
#[cfg(any(test, feature = "test-util"))]
pub mod testing;
pub mod timing;
pub mod tool;
pub mod transport;
pub mod untrusted;
