//! Images sent with a message, shown to a model that can see (`vision`):
//! read from the files the gateway placed in the run's uploads directory when
//! the run starts, and from the same paths again when a session is loaded.
//!
//! Only PNG, JPEG, GIF and WebP files (judged by their bytes, not their
//! names) are sent, each at most [`MAX_IMAGE_BYTES`]. One request carries at
//! most [`MAX_IMAGES`] images and [`MAX_TOTAL_IMAGE_BYTES`] of them, the
//! newest kept: a message's own images are bounded so, and older messages of
//! the history lose theirs first. Whatever is left out, the model still has
//! the file's path from the prompt's note and can use its tools on it.
//!
//! Files are opened without following any link (a link swapped in fails the
//! read) and never inside the gateway's state.

use std::io::Read;
use std::path::{Path, PathBuf};

use lemon_core::contain::{Access, OffLimits, Reach};
use lemon_core::media::{Attachment, AttachmentKind};

use crate::llm::{ChatMessage, ImageInput};

/// The largest image sent (5 MiB, Anthropic's limit per image).
pub const MAX_IMAGE_BYTES: u64 = 5 * 1024 * 1024;

/// The most image bytes one request carries (20 MiB; base64 makes them about
/// 27 MiB, under every provider's request limit).
pub const MAX_TOTAL_IMAGE_BYTES: u64 = 20 * 1024 * 1024;

/// The most images one request carries.
pub const MAX_IMAGES: usize = 20;

/// An image file a session record names: read again when it is loaded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageRef {
    pub path: PathBuf,
    /// The type it had when sent; the bytes read again decide.
    pub mime: String,
}

/// How many images, and how many bytes of them, a request still has room for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Room {
    pub images: usize,
    pub bytes: u64,
}

impl Room {
    /// A whole request's: [`MAX_IMAGES`] and [`MAX_TOTAL_IMAGE_BYTES`].
    pub const REQUEST: Room = Room { images: MAX_IMAGES, bytes: MAX_TOTAL_IMAGE_BYTES };

    /// Takes `image` if it fits.
    fn take(&mut self, image: &ImageInput) -> bool {
        let size = image.data.len() as u64;
        let fits = self.images > 0 && size <= self.bytes;
        if fits {
            self.images -= 1;
            self.bytes -= size;
        }
        fits
    }
}

/// The images of `attachments` to show the model, in their order: the ones
/// that are images and within the bounds of one request.
pub async fn from_attachments(
    attachments: &[Attachment],
    off_limits: &OffLimits,
) -> Vec<ImageInput> {
    let refs = attachments
        .iter()
        .filter(|a| a.kind == AttachmentKind::Image)
        .map(|a| ImageRef { path: a.path.clone(), mime: a.mime.clone() })
        .collect();
    let mut room = Room::REQUEST;
    read(refs, off_limits, &mut room).await
}

/// Reads the images `refs` name, in their order, as far as `room` lasts
/// (what they take is taken from it); a file that is missing, unreadable, no
/// PNG, JPEG, GIF or WebP, or over [`MAX_IMAGE_BYTES`] is left out.
pub async fn read(refs: Vec<ImageRef>, off_limits: &OffLimits, room: &mut Room) -> Vec<ImageInput> {
    if refs.is_empty() {
        return Vec::new();
    }
    let reach = Reach::new([PathBuf::from("/")], off_limits.clone());
    let mut left = *room;
    let reading = move || {
        let mut images = Vec::new();
        for image in refs {
            if left.images == 0 {
                tracing::info!(path = %image.path.display(), "more images than one request carries; not shown to the model");
                continue;
            }
            match read_one(&reach, &image.path) {
                Ok((data, mime)) => {
                    let image = ImageInput {
                        mime: mime.to_owned(),
                        data: data.into(),
                        path: Some(image.path),
                    };
                    if left.take(&image) {
                        images.push(image);
                    } else {
                        tracing::info!(path = ?image.path, "the images of one request would be too large; not shown to the model");
                    }
                }
                Err(why) => {
                    tracing::info!(path = %image.path.display(), %why, "image not shown to the model");
                }
            }
        }
        (images, left)
    };
    match tokio::task::spawn_blocking(reading).await {
        Ok((images, left)) => {
            *room = left;
            images
        }
        Err(_) => Vec::new(),
    }
}

/// The bytes of the image at `path` and their type.
fn read_one(reach: &Reach, path: &Path) -> Result<(Vec<u8>, &'static str), String> {
    let file = reach.open(path, Access::Read).map_err(|e| e.to_string())?;
    let meta = file.metadata().map_err(|e| e.to_string())?;
    if !meta.is_file() {
        return Err("not a regular file".to_owned());
    }
    if meta.len() > MAX_IMAGE_BYTES {
        return Err(format!(
            "{} bytes, over the {MAX_IMAGE_BYTES} bytes an image may have",
            meta.len()
        ));
    }
    let mut data = Vec::with_capacity(meta.len() as usize);
    file.take(MAX_IMAGE_BYTES + 1).read_to_end(&mut data).map_err(|e| e.to_string())?;
    if data.len() as u64 > MAX_IMAGE_BYTES {
        return Err(format!("over the {MAX_IMAGE_BYTES} bytes an image may have"));
    }
    let mime = lemon_core::media::sniff_image(&data)
        .ok_or_else(|| "not a PNG, JPEG, GIF or WebP image".to_owned())?;
    Ok((data, mime))
}

/// Drops the images of older messages beyond what one request carries
/// ([`Room::REQUEST`]), the newest kept; the text of every message stays,
/// with the paths it names.
pub fn keep_newest(messages: &mut [ChatMessage]) {
    let mut room = Room::REQUEST;
    for message in messages.iter_mut().rev() {
        if let ChatMessage::User { images, .. } = message {
            images.retain(|image| room.take(image));
        }
    }
}

/// Drops every image of `messages`; whether there were any.
pub fn drop_all(messages: &mut [ChatMessage]) -> bool {
    let mut dropped = false;
    for message in messages {
        if let ChatMessage::User { images, .. } = message {
            dropped |= !images.is_empty();
            images.clear();
        }
    }
    dropped
}

#[cfg(test)]
mod tests;
