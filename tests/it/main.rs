//! Integration tests.

mod cli_compliance;
mod cli_fixtures;
mod cli_process;
mod cli_support;
