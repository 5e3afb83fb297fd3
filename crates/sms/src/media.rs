//! MMS: the pictures and files a text brings. Twilio's webhook names them
//! (`NumMedia`, `MediaUrl{N}`, `MediaContentType{N}`); each is fetched with
//! the account's basic auth from its media URL, which must be on Twilio's
//! API host (`api_base_url`): a URL elsewhere is never fetched, so a forged
//! webhook cannot make the gateway send its credentials anywhere. Twilio
//! answers a media URL with a redirect to its CDN, which gets no credentials
//! (see [`lemon_transports::media::fetch`]). The files are checked against
//! `[gateway.sms.files]` and staged for the run like every channel's.

use lemon_core::media::{Attachment, FilesConfig, MediaRefusal, MediaStage};
use lemon_core::secrets::SecretValue;
use lemon_transports::media::{self as shared, BasicAuth, Fetcher, RemoteFile};

/// The most media Twilio sends with one message.
pub const MAX_MEDIA: usize = 10;

/// One file a text brings, as the webhook names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InboundMedia {
    /// Never logged: it names the account and the message.
    pub url: String,
    pub content_type: Option<String>,
}

/// The media of a webhook's form: `MediaUrl0` … `MediaUrl{NumMedia-1}` with
/// their `MediaContentType{N}` (at most [`MAX_MEDIA`]).
pub fn media_of(params: &[(String, String)]) -> Vec<InboundMedia> {
    let field = |name: &str| {
        params.iter().find(|(key, _)| key == name).map(|(_, value)| value.trim().to_owned())
    };
    let count = field("NumMedia").and_then(|n| n.parse::<usize>().ok()).unwrap_or(0).min(MAX_MEDIA);
    (0..count)
        .filter_map(|n| {
            let url = field(&format!("MediaUrl{n}")).filter(|url| !url.is_empty())?;
            let content_type = field(&format!("MediaContentType{n}")).filter(|t| !t.is_empty());
            Some(InboundMedia { url, content_type })
        })
        .collect()
}

/// What the conversations need to take a text's media.
#[derive(Debug, Clone)]
pub(crate) struct MmsMedia {
    pub(crate) stage: MediaStage,
    pub(crate) files: FilesConfig,
    pub(crate) fetcher: Fetcher,
    /// The account SID and auth token.
    pub(crate) auth: BasicAuth,
    /// Where media URLs must be (`api_base_url`).
    pub(crate) api_base_url: String,
}

impl MmsMedia {
    /// The media settings of a channel whose API is `api_base_url`, with the
    /// account's credentials; a Twilio on this machine (a test's fake)
    /// serves its media from here too.
    pub(crate) fn new(
        stage: MediaStage,
        files: FilesConfig,
        api_base_url: &str,
        account_sid: &str,
        auth_token: &str,
    ) -> Self {
        MmsMedia {
            stage,
            files,
            fetcher: Fetcher::new(shared::is_local_url(api_base_url)),
            auth: BasicAuth {
                user: account_sid.to_owned(),
                password: SecretValue::new(auth_token),
            },
            api_base_url: api_base_url.to_owned(),
        }
    }

    /// Fetches and keeps every file of a text from `from`; `Err` is the
    /// reply that refuses them (then nothing is kept).
    pub(crate) async fn receive(
        &self,
        from: &str,
        media: &[InboundMedia],
    ) -> Result<Vec<Attachment>, String> {
        if !self.files.enabled {
            return Err(MediaRefusal::Disabled.to_string());
        }
        if !self.files.user_allowed(from) {
            return Err(MediaRefusal::UserNotAllowed.to_string());
        }
        let mut kept = Vec::new();
        let mut refused = Vec::new();
        for (n, item) in media.iter().enumerate() {
            let fallback = format!("mms-{}{}", n + 1, extension(item.content_type.as_deref()));
            if !same_origin(&item.url, &self.api_base_url) {
                tracing::warn!("an MMS media URL not on Twilio's API host was not fetched");
                refused
                    .push(MediaRefusal::Fetch(format!("{fallback} is not on Twilio's API host")));
                continue;
            }
            let remote = RemoteFile {
                url: &item.url,
                name: None,
                fallback: &fallback,
                mime: item.content_type.as_deref(),
                size: None,
            };
            match shared::fetch_and_keep(
                &self.fetcher,
                &self.stage,
                &self.files,
                remote,
                Some(&self.auth),
            )
            .await
            {
                Ok(file) => kept.push(file),
                Err(refusal) => refused.push(refusal),
            }
        }
        match shared::refusals_text(&refused) {
            Some(reply) => {
                self.stage.discard(&kept);
                Err(reply)
            }
            None => Ok(kept),
        }
    }
}

/// Whether `url` has the scheme, host and port of `base`.
fn same_origin(url: &str, base: &str) -> bool {
    match (reqwest::Url::parse(url.trim()), reqwest::Url::parse(base.trim())) {
        (Ok(url), Ok(base)) => url.origin() == base.origin(),
        _ => false,
    }
}

/// `.jpg` for `image/jpeg`, …; empty for a type without a usual extension.
fn extension(content_type: Option<&str>) -> &'static str {
    let mime = content_type.unwrap_or_default().split(';').next().unwrap_or_default().trim();
    match mime.to_ascii_lowercase().as_str() {
        "image/jpeg" | "image/jpg" => ".jpg",
        "image/png" => ".png",
        "image/gif" => ".gif",
        "image/webp" => ".webp",
        "image/heic" => ".heic",
        "application/pdf" => ".pdf",
        "text/plain" => ".txt",
        "text/vcard" | "text/x-vcard" => ".vcf",
        "text/calendar" => ".ics",
        "audio/amr" => ".amr",
        "audio/mpeg" => ".mp3",
        "audio/ogg" => ".ogg",
        "audio/mp4" => ".m4a",
        "video/mp4" => ".mp4",
        "video/3gpp" => ".3gp",
        _ => "",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn form(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
    }

    #[test]
    fn media_are_read_from_the_webhook_form() {
        let params = form(&[
            ("NumMedia", "2"),
            ("MediaUrl0", "https://api.twilio.com/m/ME1"),
            ("MediaContentType0", "image/jpeg"),
            ("MediaUrl1", "https://api.twilio.com/m/ME2"),
            ("MediaUrl2", "https://api.twilio.com/m/ME3"),
        ]);
        let media = media_of(&params);
        assert_eq!(media.len(), 2, "only NumMedia of them");
        assert_eq!(media[0].content_type.as_deref(), Some("image/jpeg"));
        assert_eq!(
            media[1],
            InboundMedia { url: "https://api.twilio.com/m/ME2".into(), content_type: None }
        );
        assert!(media_of(&form(&[("NumMedia", "0")])).is_empty());
        assert!(media_of(&form(&[("NumMedia", "x"), ("MediaUrl0", "u")])).is_empty());
        let many: Vec<(String, String)> = std::iter::once(("NumMedia".to_owned(), "50".to_owned()))
            .chain((0..50).map(|n| (format!("MediaUrl{n}"), format!("https://api.twilio.com/{n}"))))
            .collect();
        assert_eq!(media_of(&many).len(), MAX_MEDIA);
    }

    #[test]
    fn names_take_the_types_extension_and_urls_must_be_twilios() {
        assert_eq!(extension(Some("image/jpeg")), ".jpg");
        assert_eq!(extension(Some("application/pdf; x=1")), ".pdf");
        assert_eq!(extension(Some("application/x-unknown")), "");
        assert_eq!(extension(None), "");
        let base = "https://api.twilio.com";
        assert!(same_origin(
            "https://api.twilio.com/2010-04-01/Accounts/AC1/Messages/MM1/Media/ME1",
            base
        ));
        assert!(!same_origin("https://evil.example/api.twilio.com", base));
        assert!(!same_origin("http://api.twilio.com/x", base));
        assert!(!same_origin("https://api.twilio.com:8443/x", base));
        assert!(!same_origin("not a url", base));
    }

    #[tokio::test]
    async fn a_url_off_twilios_host_is_refused_without_a_fetch_and_nothing_is_kept() {
        let dir = tempfile::tempdir().unwrap();
        let media = MmsMedia::new(
            MediaStage::new(dir.path().join("stage")),
            FilesConfig::default(),
            "https://api.twilio.com",
            "AC1",
            "token-secret",
        );
        let sent = [InboundMedia {
            url: "https://evil.example/x.jpg".into(),
            content_type: Some("image/jpeg".into()),
        }];
        let reply = media.receive("+15550001111", &sent).await.unwrap_err();
        assert_eq!(reply, "the file could not be fetched: mms-1.jpg is not on Twilio's API host");
        assert!(!dir.path().join("stage").exists());
        let off =
            MmsMedia { files: FilesConfig { enabled: false, ..FilesConfig::default() }, ..media };
        assert_eq!(
            off.receive("+15550001111", &sent).await.unwrap_err(),
            "files are not accepted here"
        );
        assert!(!format!("{:?}", off.auth).contains("token-secret"));
    }
}
