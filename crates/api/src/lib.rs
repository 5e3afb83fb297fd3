//! Lemon Gateway's HTTP face: the control API, health and metrics, and the
//! HTTP plumbing every listener shares.
//!
//! # Layout
//! - [`api`]: the control API (`/v1/...`): submit, inspect, cancel and steer runs,
//!   and follow their events over Server-Sent Events. Bearer-token protected.
//! - [`dashboard`]: the web dashboard at `/` with its assets under `/ui/`,
//!   embedded in the binary and served without the token under a strict CSP.
//! - [`secrets`]: `/v1/secrets` (names, sources and uses; set and delete, never a value back).
//! - [`openapi`]: the OpenAPI document of every `/v1` route, from the
//!   handlers' annotations and the types they read and write, served at
//!   `/v1/openapi.json`; the book's HTTP API reference is rendered from it.
//! - [`health`]: `/healthz`, `/health` and `/metrics`, meant for a loopback or
//!   internal port; without the API token `/healthz` shows states only.
//! - [`mcp`]: the MCP endpoint `/mcp`: for a run's token, `approve` (where
//!   Claude Code's permission prompts reach the owner's approvals) and the
//!   gateway's tools acting for the run; for the API token, the gateway's
//!   tools and `run`, `status`, `cancel` and `runs`.
//! - [`cluster`]: a cluster node in `/v1/status`, `/healthz` and `/metrics`.
//! - [`metrics`]: the collector of run metrics (a task on the event bus) and
//!   the Prometheus text format `/metrics` answers in.
//! - [`files`]: files sent with a request (base64, `data:` URLs, URLs fetched
//!   with a capped download that keeps off private addresses), checked
//!   against a `files` section and staged for their run.
//! - [`error`]: [`error::ApiError`], the one JSON error shape of every router
//!   (the control API's and every channel's), and extractors whose rejections
//!   use it.
//! - [`http`]: runs a router on a listener until a shutdown token fires
//!   ([`serve`], [`serve_with`]), with header and idle timeouts, a connection cap,
//!   and JSON bodies on the errors hyper answers by itself.
//!
//! Handlers parse, call the router or its read-only query handle, and map errors;
//! they hold no business rules and never call engines.

pub mod api;
pub mod cluster;
pub mod dashboard;
pub mod error;
pub mod files;
pub mod health;
pub mod http;
pub mod mcp;
pub mod metrics;
pub mod openapi;
pub mod secrets;

pub use http::{serve, serve_with};
