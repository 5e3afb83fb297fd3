//! Integration tests: the real binaries, real sockets, real SQLite files, real
//! child processes.

// End-to-end tests start the real server and client binaries, as users do.
#![allow(clippy::disallowed_methods)]

mod approvals_e2e;
mod artifacts_e2e;
mod budgets_e2e;
mod callback_e2e;
mod cli_compliance;
mod cli_fixtures;
mod cli_injection;
mod cli_lifetime;
mod cli_process;
mod cli_support;
mod cli_ux;
mod cron_e2e;
mod dashboard_e2e;
mod discord_e2e;
mod doctor_e2e;
mod email_e2e;
mod fault_cli;
mod fault_discord;
mod fault_kill;
mod fault_llm;
mod fault_sms;
mod fault_store;
mod fault_support;
mod fault_telegram;
mod files_e2e;
mod first_run;
mod gateway_e2e;
mod hardening_e2e;
mod home_reach_e2e;
mod http_hardening;
mod intake_e2e;
mod listeners_e2e;
mod llm_clients;
mod load_e2e;
mod media_e2e;
mod metrics_e2e;
mod native_e2e;
mod openai_e2e;
mod openapi_e2e;
mod process_reach_e2e;
mod queue_cap_e2e;
mod real_cli;
mod reference_keys_e2e;
mod reload_e2e;
mod retry_e2e;
mod router_crash;
mod router_resume;
mod secrets_e2e;
mod server_embed;
mod sms_e2e;
mod store_e2e;
mod strangers_e2e;
mod support;
mod telegram_api;
mod telegram_e2e;
mod telegram_keys_e2e;
mod telegram_media_e2e;
mod token_e2e;
mod voice_e2e;
mod webhook_e2e;
mod xmtp_e2e;
