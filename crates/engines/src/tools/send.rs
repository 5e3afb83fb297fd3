//! `telegram_send_image` and `discord_send_file`: a file of the run handed to
//! the chat. The tool only checks the file and queues it in its result
//! (`details.auto_send_files: [{path, filename, caption}]`); the channel
//! delivers it with the answer.
//!
//! Each is offered only to sessions of its channel: session keys of the form
//! `agent:<agent>:<channel>:<account>:<peer_kind>:<peer_id>[:thread:<id>]`.
//! The file must be a regular file inside the run's cwd or the workspace
//! after every symlink is resolved, and not the gateway's own state.

use std::path::{Path, PathBuf};

use async_trait::async_trait;
use lemon_core::contain::ContainError;
use lemon_core::ids::SessionKey;
use lemon_core::tool::{Tool, ToolContext, ToolOutput, ToolSpec};
use serde_json::{json, Value};

use super::args::Args;

/// The image types Telegram shows as photos.
const IMAGE_EXTENSIONS: &[&str] =
    &["png", "jpg", "jpeg", "gif", "webp", "bmp", "svg", "tif", "tiff", "heic", "heif"];

/// Which channel a send tool is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Channel {
    Telegram,
    Discord,
}

impl Channel {
    fn id(self) -> &'static str {
        match self {
            Channel::Telegram => "telegram",
            Channel::Discord => "discord",
        }
    }
}

/// Whether `session` is a channel-peer session of `channel`.
fn is_channel_session(session: &str, channel: &str) -> bool {
    let parts: Vec<&str> = session.split(':').collect();
    parts.len() >= 6
        && parts[0] == "agent"
        && parts[2] == channel
        && parts.iter().take(6).all(|part| !part.is_empty())
}

/// `telegram_send_image` or `discord_send_file`.
#[derive(Debug)]
pub(super) struct SendFile {
    channel: Channel,
    home: Option<PathBuf>,
    max_bytes: u64,
}

impl SendFile {
    pub(super) fn telegram(home: Option<PathBuf>, max_bytes: u64) -> Self {
        SendFile { channel: Channel::Telegram, home, max_bytes }
    }

    pub(super) fn discord(home: Option<PathBuf>, max_bytes: u64) -> Self {
        SendFile { channel: Channel::Discord, home, max_bytes }
    }

    fn name(&self) -> &'static str {
        match self.channel {
            Channel::Telegram => "telegram_send_image",
            Channel::Discord => "discord_send_file",
        }
    }

    /// `~` and `~/…` made absolute with the user's home.
    fn expand(&self, raw: &str) -> PathBuf {
        match (&self.home, raw.strip_prefix('~')) {
            (Some(home), Some("")) => home.clone(),
            (Some(home), Some(rest)) if rest.starts_with('/') => home.join(&rest[1..]),
            _ => PathBuf::from(raw),
        }
    }

    /// Where `raw` may be: workspace-relative spellings first, then `raw`
    /// against each root (an absolute path is itself).
    fn candidates(&self, raw: &str, ctx: &ToolContext) -> Vec<PathBuf> {
        let path = self.expand(raw);
        if path.is_absolute() {
            return vec![path];
        }
        let mut out = Vec::new();
        if let Some(workspace) = &ctx.workspace {
            for prefix in ["workspace/", "./workspace/", ".lemon/agent/workspace/"] {
                if let Some(rest) = raw.strip_prefix(prefix) {
                    out.push(workspace.join(rest));
                }
            }
        }
        out.push(ctx.cwd.join(&path));
        if let Some(workspace) = &ctx.workspace {
            out.push(workspace.join(&path));
        }
        out
    }

    /// The first candidate that is a regular file inside the roots.
    fn resolve(&self, raw: &str, ctx: &ToolContext) -> Result<PathBuf, String> {
        let reach = ctx.reach();
        let mut outside = false;
        for candidate in self.candidates(raw, ctx) {
            match reach.resolve(&candidate) {
                Ok(path) if std::fs::metadata(&path).is_ok_and(|meta| meta.is_file()) => {
                    return Ok(path);
                }
                Ok(_) => {}
                Err(ContainError::OffLimits { .. }) => {
                    return Err(format!(
                        "{raw} is the gateway's own state (its home, config or secrets); it cannot be sent"
                    ));
                }
                Err(ContainError::Outside { .. }) => outside = true,
                // A symlink loop, a dangling link: nothing to send there.
                Err(_) => {}
            }
        }
        if outside {
            return Err(format!(
                "{raw} is outside the working directory and the workspace; only files there can be sent"
            ));
        }
        Err(match self.channel {
            Channel::Telegram => format!("Image not found: {raw}"),
            Channel::Discord => format!("File not found: {raw}"),
        })
    }

    fn send(&self, args: &Value, ctx: &ToolContext) -> Result<ToolOutput, String> {
        if !self.offered(&ctx.session_key) {
            return Err(match self.channel {
                Channel::Telegram => {
                    "telegram_send_image is only available for Telegram channel sessions."
                }
                Channel::Discord => {
                    "discord_send_file is only available for Discord channel sessions."
                }
            }
            .to_owned());
        }
        let args = Args::new(args)?;
        let raw = args.required_str("path")?;
        let caption = args.text("caption").map_err(|_| "caption must be a string".to_owned())?;
        let caption = caption.map(|c| c.trim().to_owned()).filter(|c| !c.is_empty());
        let filename_arg = match self.channel {
            Channel::Discord => args.str("filename")?,
            Channel::Telegram => None,
        };
        let path = self.resolve(&raw, ctx)?;
        if self.channel == Channel::Telegram {
            let ext = path
                .extension()
                .map(|ext| ext.to_string_lossy().to_ascii_lowercase())
                .unwrap_or_default();
            if !IMAGE_EXTENSIONS.contains(&ext.as_str()) {
                let shown = if ext.is_empty() { "(none)".to_owned() } else { format!(".{ext}") };
                return Err(format!("Unsupported image type for telegram_send_image: {shown}"));
            }
        }
        let size = std::fs::metadata(&path).map_err(|err| format!("{raw}: {err}"))?.len();
        if size > self.max_bytes {
            return Err(format!(
                "{raw} is {size} bytes, over the {}-byte limit of {}",
                self.max_bytes,
                self.channel.id()
            ));
        }
        let basename = base_name(&path);
        let filename = filename_arg.map(|name| base_name(Path::new(&name))).unwrap_or(basename);
        let text = match self.channel {
            Channel::Telegram => format!("Queued image for Telegram delivery: {filename}"),
            Channel::Discord => format!("Queued file for Discord delivery: {filename}"),
        };
        let details = json!({
            "auto_send_files": [{
                "path": path.display().to_string(),
                "filename": filename,
                "caption": caption,
            }]
        });
        Ok(ToolOutput::ok(text, details))
    }
}

/// The last component of `path` (a filename given with directories keeps only its name).
fn base_name(path: &Path) -> String {
    path.file_name().map(|name| name.to_string_lossy().into_owned()).unwrap_or_default()
}

#[async_trait]
impl Tool for SendFile {
    fn spec(&self) -> ToolSpec {
        match self.channel {
            Channel::Telegram => ToolSpec {
                name: self.name().to_owned(),
                description: format!(
                    "Send an image from the working directory or workspace to this Telegram \
                     chat as a photo, with an optional caption. Types: {}. At most {} bytes.",
                    IMAGE_EXTENSIONS.iter().map(|e| format!(".{e}")).collect::<Vec<_>>().join(" "),
                    self.max_bytes
                ),
                parameters: json!({
                    "type": "object",
                    "properties": {
                        "path": {"type": "string", "description": "Image path, relative to the working directory or workspace"},
                        "caption": {"type": "string", "description": "Caption shown under the photo"}
                    },
                    "required": ["path"],
                    "additionalProperties": false
                }),
            },
            Channel::Discord => ToolSpec {
                name: self.name().to_owned(),
                description: format!(
                    "Send a file from the working directory or workspace to this Discord \
                     channel as an attachment, with an optional caption. At most {} bytes.",
                    self.max_bytes
                ),
                parameters: json!({
                    "type": "object",
                    "properties": {
                        "path": {"type": "string", "description": "File path, relative to the working directory or workspace"},
                        "filename": {"type": "string", "description": "Name the attachment gets (default: the file's name)"},
                        "caption": {"type": "string", "description": "Message sent with the file"}
                    },
                    "required": ["path"],
                    "additionalProperties": false
                }),
            },
        }
    }

    fn offered(&self, session: &SessionKey) -> bool {
        is_channel_session(session, self.channel.id())
    }

    async fn execute(&self, args: Value, ctx: ToolContext) -> ToolOutput {
        match self.send(&args, &ctx) {
            Ok(output) => output,
            Err(message) => ToolOutput::error(message),
        }
    }
}

#[cfg(test)]
mod tests;
