//! Shared test support.
//!
//! # Layout
//! - [`fake_cli`]: the `fake-cli` binary installed under the vendor CLIs' names on a
//!   temporary `PATH`, and the recorded CLI streams it replays.
//! - [`fake_discord`]: a fake Discord (Gateway WebSocket and REST API with rate
//!   limits) on loopback, for the gateway binary to connect to.
//! - [`fake_llm`]: a fake LLM provider on loopback speaking OpenAI Chat
//!   Completions, OpenAI Responses and Anthropic Messages, scripted per test.
//! - [`dovecot`]: Debian's Dovecot IMAP server started for a test, with mail
//!   put in by `APPEND`.
//! - [`fake_smtp`]: a fake SMTP server on loopback that keeps the mail it is sent.
//! - [`fake_telegram`]: a fake Telegram Bot API server on loopback, for the
//!   Telegram client's tests and for the gateway binary to poll.
//! - [`event_stream`]: a reader of Server-Sent Events streams, the tests' own
//!   (not the product's), by the WHATWG rules.
//! - [`history`]: a checker over a cluster test's recorded history (engine
//!   intervals, completions, pollers, followers).
//! - [`host`]: what a test needs of the machine, and the `LEMON_REQUIRE_*`
//!   switches that make a missing need fail instead of skip.
//! - [`prometheus`]: a strict reader of the Prometheus text format, for `/metrics`.
//! - [`fake_twilio`]: a fake Twilio REST API (message create) on loopback, and
//!   Twilio's webhook signatures, for the SMS channel.

//! - [`tls_cert`]: a self-signed certificate made by `openssl`, for TLS fakes.
//! - [`fake_xmtp`]: the hub the fake XMTP bridge (`fake-xmtp-bridge`, started
//!   by the gateway as its bridge) connects to, so a test speaks the bridge's side.
//! - [`fake_deepgram`], [`fake_elevenlabs`], [`fake_twilio_voice`]: a voice
//!   call's providers on loopback (live transcription, speech, Twilio's media
//!   stream, signed webhooks and REST API).
//! - [`fake_transcribe`]: a transcription service speaking OpenAI's
//!   `/audio/transcriptions` and Deepgram's pre-recorded `/v1/listen`, for
//!   the chat channels' voice messages.

pub mod dovecot;
pub mod event_stream;
pub mod fake_deepgram;
pub mod fake_discord;
pub mod fake_elevenlabs;
pub mod fake_llm;
pub mod fake_smtp;
pub mod fake_telegram;
pub mod fake_transcribe;
pub mod fake_twilio;
pub mod fake_twilio_voice;
pub mod fake_xmtp;
pub mod history;
pub mod host;
pub mod load;
pub mod prometheus;
pub mod tls_cert;

pub mod fake_cli {
    //! The fake vendor CLI (`src/bin/fake_cli.rs`) on a temporary `PATH`, and the
    //! recorded JSONL streams under `fixtures/cli/`.

    use std::io;
    use std::os::unix::fs::symlink;
    use std::path::{Path, PathBuf};

    /// The names the fake is installed under: every vendor CLI engine's executable.
    pub const VENDOR_NAMES: [&str; 5] = ["claude", "codex", "opencode", "pi", "droid"];

    /// A temporary directory holding `claude`, `codex`, … as symlinks to the fake.
    #[derive(Debug)]
    pub struct FakeCliDir {
        dir: tempfile::TempDir,
    }

    impl FakeCliDir {
        /// Installs `fake_bin` (a test's `env!("CARGO_BIN_EXE_fake-cli")`) under every vendor name.
        ///
        /// # Errors
        /// When the directory or a symlink cannot be made.
        pub fn install(fake_bin: &Path) -> io::Result<Self> {
            let dir = tempfile::tempdir()?;
            for name in VENDOR_NAMES {
                symlink(fake_bin, dir.path().join(name))?;
            }
            Ok(FakeCliDir { dir })
        }

        pub fn path(&self) -> &Path {
            self.dir.path()
        }

        /// The directory as a `PATH` value.
        pub fn search_path(&self) -> String {
            self.dir.path().to_string_lossy().into_owned()
        }
    }

    /// `tests/fixtures/cli`.
    pub fn fixtures_dir() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures").join("cli")
    }

    /// `tests/fixtures/cli/<vendor>/<name>`.
    pub fn fixture(vendor: &str, name: &str) -> PathBuf {
        fixtures_dir().join(vendor).join(name)
    }
}
