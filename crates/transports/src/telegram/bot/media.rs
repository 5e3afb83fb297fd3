//! Photos, files and voice notes sent to the bot, and `/file`.
//!
//! - A message with files (`photo`, `document`, `audio`, `video`,
//!   `animation`, `video_note`, and `voice` when transcription is off) is
//!   checked against `[gateway.telegram.files]` (enabled, `allowed_user_ids`
//!   against the sender, each file's name, `deny_globs` and announced size)
//!   before anything is fetched; one refusal refuses the message, with the
//!   reasons as the reply, and no run starts. Otherwise each file is fetched
//!   (`getFile`, then the download URL, which holds the token and goes to the
//!   fetcher only) and kept in the stage; the caption is the prompt
//!   ([`media::FILES_ONLY_PROMPT`] without one).
//! - An album (`media_group_id`) waits until none of its messages has come
//!   for `media_group_debounce_ms` and then goes as one message.
//! - A voice note, with `voice_transcription` on, is transcribed: its words
//!   are the prompt, marked `(voice transcribed)` as the reference does, and
//!   shown back as `heard: …` first with `show_transcript`.
//! - `/file put [--force] [path]` as a file's caption saves it in the chat's
//!   project; `/file get <path>` sends a project file back as a document.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use lemon_core::contain::OffLimits;
use lemon_core::log_text;
use lemon_core::media::{
    check_file_name, mime_of_name, Attachment, FileCommand, MediaRefusal, FILE_USAGE,
};
use lemon_core::router::RouteError;

use super::{message_to, Bot, Waiting};
use crate::media::{self, RemoteFile};
use crate::telegram::albums;
use crate::telegram::inbound::{self, IncomingFile};
use crate::telegram::outbox::DeliveryError;
use crate::telegram::types::{FileKind, FormattedText, Message, SendFile};

/// What a message with files is answered when `auto_put` is off.
pub(crate) const AUTO_PUT_OFF: &str =
    "Files are saved only with /file put [path] as their caption here (auto_put is off).";

/// What `/file put` without a file is answered.
const PUT_NEEDS_A_FILE: &str = "Send the file with /file put [path] as its caption.";

/// What marks a prompt that was a voice note (the reference's mark).
pub(crate) const VOICE_MARK: &str = "(voice transcribed)";

/// What a run made of received files carries besides its prompt.
#[derive(Debug, Default)]
pub(super) struct Received {
    pub(super) attachments: Vec<Attachment>,
    pub(super) voice_transcribed: bool,
}

impl Bot {
    /// Whether the sender of `message` may send files (`allowed_user_ids`;
    /// a channel post has no sender and passes only an empty list).
    fn files_allowed(&self, message: &Message) -> bool {
        let files = &self.config.files;
        match &message.from {
            Some(from) => files.user_allowed(&from.id.to_string()),
            None => files.allowed_user_ids.is_empty(),
        }
    }

    /// Refuses files when the section is off or the sender may not.
    fn files_refusal(&self, message: &Message) -> Option<MediaRefusal> {
        if !self.config.files.enabled {
            return Some(MediaRefusal::Disabled);
        }
        (!self.files_allowed(message)).then_some(MediaRefusal::UserNotAllowed)
    }

    /// A message with files; `caption` is its caption without the bot's mention.
    pub(super) async fn on_media(self: &Arc<Self>, message: Message, caption: String) {
        if let Some(refusal) = self.files_refusal(&message) {
            self.reply_soon(&message, refusal.to_string());
            return;
        }
        match lemon_core::media::parse_file_command(&caption) {
            Some(Ok(FileCommand::Put { path, force })) => {
                self.file_put(&message, path.as_deref(), force).await;
                return;
            }
            Some(Ok(FileCommand::Get { path })) => {
                self.file_get(&message, &path).await;
                return;
            }
            Some(Err(usage)) => {
                self.reply_soon(&message, usage.to_owned());
                return;
            }
            None => {}
        }
        if !self.config.files.auto_put {
            self.reply_soon(&message, AUTO_PUT_OFF.to_owned());
            return;
        }
        let Some(group) = message.media_group_id.clone() else {
            self.receive(vec![(message, caption)]).await;
            return;
        };
        let key = format!("{}:{group}", message.chat.id);
        let first = self.albums().push(&key, (message, caption), tokio::time::Instant::now());
        if first {
            let bot = self.clone();
            self.tracker.spawn(async move {
                let items = tokio::select! {
                    () = bot.shutdown.cancelled() => return,
                    items = albums::collect(&bot.albums, &key) => items,
                };
                if !items.is_empty() {
                    bot.receive(items).await;
                }
            });
        }
    }

    fn albums(&self) -> std::sync::MutexGuard<'_, albums::Albums<(Message, String)>> {
        self.albums.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// `/file …` as a text message: `get` sends the file, `put` needs one.
    pub(super) async fn on_file_command(self: &Arc<Self>, message: &Message, text: &str) {
        if let Some(refusal) = self.files_refusal(message) {
            self.reply_soon(message, refusal.to_string());
            return;
        }
        match lemon_core::media::parse_file_command(text) {
            Some(Ok(FileCommand::Get { path })) => self.file_get(message, &path).await,
            Some(Ok(FileCommand::Put { .. })) => {
                self.reply_soon(message, PUT_NEEDS_A_FILE.to_owned());
            }
            Some(Err(usage)) => self.reply_soon(message, usage.to_owned()),
            None => self.reply_soon(message, FILE_USAGE.to_owned()),
        }
    }

    /// The files (or voice note) of one message or an album, fetched and
    /// submitted as one run; refusals are replied and start nothing.
    async fn receive(self: &Arc<Self>, items: Vec<(Message, String)>) {
        let Some((last, _)) = items.last() else { return };
        let last = last.clone();
        let captions: Vec<&str> =
            items.iter().map(|(_, c)| c.as_str()).filter(|c| !c.is_empty()).collect();
        let caption = captions.join("\n");
        if let (true, Some(voice)) = (items.len() == 1 && self.transcriber.is_some(), &last.voice) {
            let voice = voice.clone();
            self.receive_voice(&last, &voice, caption).await;
            return;
        }
        let files = &self.config.files;
        let voice_apart = self.transcriber.is_some();
        let mut wanted = Vec::new();
        let mut refused = Vec::new();
        for (message, _) in &items {
            for file in inbound::files_of(message, files.max_download_bytes, voice_apart) {
                match file.and_then(|file| precheck(files, file)) {
                    Ok(file) => wanted.push(file),
                    Err(refusal) => refused.push(refusal),
                }
            }
        }
        let mut kept = Vec::new();
        if refused.is_empty() {
            for file in &wanted {
                match self.fetch_and_keep(file).await {
                    Ok(attachment) => kept.push(attachment),
                    Err(refusal) => refused.push(refusal),
                }
            }
        }
        if let Some(reply) = media::refusals_text(&refused) {
            tracing::info!(
                chat_id = last.chat.id,
                refused = refused.len(),
                reply = %log_text::escape(&reply),
                "files of a message refused; no run"
            );
            self.media.discard(&kept);
            self.reply_soon(&last, reply);
            return;
        }
        if files.auto_put_mode == lemon_core::media::AutoPutMode::Upload {
            self.upload_only(&last, kept).await;
            return;
        }
        let prompt = if caption.is_empty() { media::FILES_ONLY_PROMPT.to_owned() } else { caption };
        let received = Received { attachments: kept, voice_transcribed: false };
        self.submit_with(vec![Waiting { message: last, text: prompt }], None, received).await;
    }

    /// A voice note transcribed: its words are the prompt.
    async fn receive_voice(
        self: &Arc<Self>,
        message: &Message,
        voice: &crate::telegram::types::TelegramFile,
        caption: String,
    ) {
        let Some(transcriber) = &self.transcriber else { return };
        let seconds = voice.duration.map(|s| s as f64);
        let words = async {
            transcriber.admit(voice.file_size, seconds)?;
            let url =
                self.download_url(&voice.file_id).await.map_err(media::TranscribeError::Fetch)?;
            let note = media::transcribe::RemoteVoice {
                file_name: "voice-message.ogg",
                mime: voice.mime_type.as_deref().or(Some("audio/ogg")),
                bytes: voice.file_size,
                seconds,
            };
            transcriber.fetch_and_transcribe(&self.fetcher, url.expose(), note, None).await
        };
        let words = match words.await {
            Ok(words) => words,
            Err(error) => {
                tracing::info!(%error, chat_id = message.chat.id, "voice message not transcribed");
                self.reply_soon(message, error.to_string());
                return;
            }
        };
        if self.config.voice.show_transcript {
            // Waited for, so it comes before the answer.
            let shown = FormattedText::plain(media::heard(&words));
            let send = message_to(
                message.chat.id,
                inbound::topic_of(message),
                Some(message.message_id),
                shown,
            );
            if let Err(error) = self.outbox.send(send).await {
                tracing::warn!(%error, "transcript not shown");
            }
        }
        let prompt = if caption.is_empty() {
            format!("{VOICE_MARK} {words}")
        } else {
            format!("{VOICE_MARK} {caption}\n\n{words}")
        };
        let received = Received { attachments: Vec::new(), voice_transcribed: true };
        let waiting = Waiting { message: message.clone(), text: prompt };
        self.submit_with(vec![waiting], None, received).await;
    }

    /// `auto_put_mode = "upload"`: the files go straight into the project's
    /// uploads directory, the reply says where; no run.
    async fn upload_only(&self, message: &Message, kept: Vec<Attachment>) {
        let (dir, off_limits) = match self.project(message).await {
            Ok(project) => project,
            Err(reply) => {
                self.media.discard(&kept);
                self.reply_soon(message, reply);
                return;
            }
        };
        let stage = self.media.clone();
        let root = dir.clone();
        let placed = tokio::task::spawn_blocking(move || {
            lemon_core::media::place(&kept, &stage, &root, &off_limits)
        })
        .await
        .unwrap_or_default();
        let shown = |path: &Path| path.strip_prefix(&dir).unwrap_or(path).display().to_string();
        let mut lines: Vec<String> =
            placed.attachments.iter().map(|a| format!("Saved {}", shown(&a.path))).collect();
        lines.extend(placed.failed.iter().map(|(name, why)| format!("{name} not saved: {why}")));
        self.reply_soon(message, lines.join("\n"));
    }

    /// `/file put [--force] [path]` with the message's one file.
    async fn file_put(self: &Arc<Self>, message: &Message, target: Option<&str>, force: bool) {
        let files = &self.config.files;
        let found = inbound::files_of(message, files.max_download_bytes, false);
        let [file] = found.as_slice() else {
            self.reply_soon(message, PUT_NEEDS_A_FILE.to_owned());
            return;
        };
        let put = async {
            let file = precheck(files, file.clone()?)?;
            let name = file_name(&file)?;
            let (dir, off_limits) = self.project(message).await.map_err(MediaRefusal::Save)?;
            let url = self.download_url(&file.file_id).await?;
            let max = files.max_download_bytes;
            let downloaded = self.fetcher.fetch(url.expose(), &name, max, None).await?;
            let (files, target) = (files.clone(), target.map(str::to_owned));
            let saved = tokio::task::spawn_blocking(move || {
                lemon_core::media::put_file(
                    &dir,
                    &off_limits,
                    &files,
                    target.as_deref(),
                    &name,
                    force,
                    &downloaded.bytes,
                )
            })
            .await
            .map_err(|_| MediaRefusal::Save("the file could not be written".to_owned()))??;
            Ok::<PathBuf, MediaRefusal>(saved)
        };
        let reply = match put.await {
            Ok(saved) => format!("Saved {}", saved.display()),
            Err(refusal) => {
                tracing::info!(%refusal, chat_id = message.chat.id, "/file put refused");
                refusal.to_string()
            }
        };
        self.reply_soon(message, reply);
    }

    /// `/file get <path>`: the project's file, sent back as a document.
    async fn file_get(&self, message: &Message, path: &str) {
        let got = async {
            let (dir, off_limits) = self.project(message).await.map_err(MediaRefusal::Fetch)?;
            let (files, path) = (self.config.files.clone(), path.to_owned());
            tokio::task::spawn_blocking(move || {
                lemon_core::media::get_file(&dir, &off_limits, &files, &path)
            })
            .await
            .map_err(|_| MediaRefusal::Fetch("the file could not be read".to_owned()))?
        };
        let (name, bytes) = match got.await {
            Ok(found) => found,
            Err(refusal) => {
                tracing::info!(%refusal, chat_id = message.chat.id, "/file get refused");
                self.reply_soon(message, refusal.to_string());
                return;
            }
        };
        // Sent from a private copy in the stage: what was checked is what goes.
        let copy = match self.outgoing_copy(&name, bytes).await {
            Ok(copy) => copy,
            Err(error) => {
                tracing::warn!(%error, "/file get: no copy to send");
                self.reply_soon(message, format!("{name} could not be sent: {error}"));
                return;
            }
        };
        let send = SendFile {
            chat_id: message.chat.id,
            kind: FileKind::Document,
            path: copy.join(&name),
            filename: name.clone(),
            mime: mime_of_name(&name).to_owned(),
            caption: Some(path.trim().chars().take(1024).collect()),
            message_thread_id: inbound::topic_of(message),
        };
        let sent = self.outbox.send_file(send).await;
        let _ = tokio::fs::remove_dir_all(&copy).await;
        match sent {
            Ok(_) | Err(DeliveryError::ShuttingDown) => {}
            Err(error) => {
                tracing::warn!(%error, "/file get: the document was not sent");
                self.reply_soon(message, format!("{name} could not be sent: {error}"));
            }
        }
    }

    /// Writes `bytes` as `name` in a fresh private directory of the stage.
    async fn outgoing_copy(&self, name: &str, bytes: Vec<u8>) -> std::io::Result<PathBuf> {
        let mut id = [0u8; 16];
        getrandom::fill(&mut id).map_err(|e| std::io::Error::other(e.to_string()))?;
        let hex: String = id.iter().map(|b| format!("{b:02x}")).collect();
        let dir = self.media.dir().join(format!("out-{hex}"));
        let (path, name) = (dir.clone(), name.to_owned());
        tokio::task::spawn_blocking(move || {
            std::fs::create_dir_all(&path)?;
            #[cfg(unix)]
            {
                use std::os::unix::fs::PermissionsExt;
                std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o700))?;
            }
            std::fs::write(path.join(name), bytes)
        })
        .await
        .map_err(|e| std::io::Error::other(e.to_string()))??;
        Ok(dir)
    }

    /// The directory a run of the message's chat works in, and the
    /// gateway's state it keeps out of; `Err` is the reply.
    async fn project(&self, message: &Message) -> Result<(PathBuf, OffLimits), String> {
        let channel = inbound::channel_ref(message);
        let dir = self.router.run_dir(Some(&channel)).await.map_err(route_reply)?;
        let off_limits = self.router.off_limits().await.map_err(route_reply)?;
        Ok((dir, off_limits))
    }

    /// `getFile`, then the file's download URL (it holds the token).
    async fn download_url(
        &self,
        file_id: &str,
    ) -> Result<crate::telegram::api::FileUrl, MediaRefusal> {
        if file_id.trim().is_empty() {
            return Err(MediaRefusal::Fetch("Telegram gave no file id".to_owned()));
        }
        let info = self.api.get_file(file_id).await.map_err(|error| {
            tracing::info!(%error, "getFile failed");
            MediaRefusal::Fetch(format!("Telegram did not hand it out ({error})"))
        })?;
        self.api.file_url(&info).map_err(|error| MediaRefusal::Fetch(error.to_string()))
    }

    /// Fetches one file within `max_download_bytes` and keeps it in the stage.
    async fn fetch_and_keep(&self, file: &IncomingFile) -> Result<Attachment, MediaRefusal> {
        let url = self.download_url(&file.file_id).await?;
        let remote = RemoteFile {
            url: url.expose(),
            name: file.name.as_deref(),
            fallback: &file.fallback,
            mime: file.mime.as_deref(),
            size: file.size,
        };
        media::fetch_and_keep(&self.fetcher, &self.media, &self.config.files, remote, None).await
    }
}

/// The name a file is saved under.
fn file_name(file: &IncomingFile) -> Result<String, MediaRefusal> {
    match file.name.as_deref() {
        Some(name) => check_file_name(name),
        None => check_file_name(&file.fallback),
    }
}

/// What can be refused before anything is fetched: the name, the deny
/// globs and the announced size.
fn precheck(
    files: &lemon_core::media::FilesConfig,
    file: IncomingFile,
) -> Result<IncomingFile, MediaRefusal> {
    let name = file_name(&file)?;
    if let Some(glob) = files.denied_by(&name) {
        return Err(MediaRefusal::Denied { name, glob });
    }
    let max = files.max_download_bytes;
    if let Some(bytes) = file.size.filter(|size| *size > max) {
        return Err(MediaRefusal::TooLarge { name, bytes, max });
    }
    Ok(file)
}

/// Why the router gave no project directory, as a reply.
fn route_reply(error: RouteError) -> String {
    match error {
        RouteError::ShuttingDown => "The gateway is shutting down.".to_owned(),
        other => format!("No project directory for this chat: {other}"),
    }
}
