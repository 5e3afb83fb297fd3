//! Lemon Gateway on a laptop: the gateway inside a tray app (or the one already
//! running on the same home), the dashboard in a window that signs in by
//! itself, and a tray menu over the gateway's runs.
//!
//! # Layout
//! - [`gateway`]: embedding [`lemon_server`] or attaching to a running gateway,
//!   and the control API calls the app makes.
//! - [`controller`]: the app's state and what every [`menu::MenuId`] does,
//!   through the [`controller::Shell`] the desktop provides.
//! - [`menu`], [`icon`], [`state`]: the tray's menu, icons and view as data.
//! - [`tray_host`]: whether this desktop shows tray icons at all.
//! - [`notifications`]: calls waiting for an answer as notifications with
//!   Approve / Deny / Always buttons.
//! - [`app`]: the Tauri glue (tray, window, plugins).

pub mod app;
pub mod controller;
pub mod gateway;
pub mod icon;
pub mod menu;
pub mod notifications;
pub mod state;
pub mod tray_host;
