//! Integration tests: the real binaries, real sockets, real SQLite files.

// End-to-end tests start the real server and client binaries, as users do.
#![allow(clippy::disallowed_methods)]

mod gateway_e2e;
mod support;
