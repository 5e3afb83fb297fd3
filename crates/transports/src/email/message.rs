//! What an incoming mail means: who sent it (and whether that can be
//! believed), which thread it belongs to, the prompt in it (quoted text and
//! signature stripped) and its attachments.

use lemon_core::ids::{RunId, SessionKey};
use mail_parser::{MessageParser, MimeHeaders};
use sha2::{Digest, Sha256};

use super::config::parse_address;

/// The transport's id, in session keys, bindings and status.
pub const TRANSPORT_ID: &str = "email";

/// Most attachments listed for one mail.
const MAX_ATTACHMENTS: usize = 20;

/// A mail as the gateway reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InboundMail {
    /// `Message-ID` without the angle brackets; made from the content when
    /// the mail has none.
    pub message_id: String,
    /// `In-Reply-To`, without angle brackets.
    pub in_reply_to: Vec<String>,
    /// `References`, oldest first, without angle brackets.
    pub references: Vec<String>,
    /// The bare sender address, lowercased (`None`: no single `From` address).
    pub from: Option<String>,
    pub subject: String,
    /// The new text of the mail: quoted replies and the signature removed.
    pub text: String,
    pub attachments: Vec<MailAttachment>,
    /// What the receiving servers' `Authentication-Results` say.
    pub auth: Vec<AuthResult>,
    /// An auto-reply, bounce or list mail (`Auto-Submitted`, `Precedence`):
    /// never answered, so two robots cannot mail each other forever.
    pub automatic: bool,
}

/// One attachment of a mail.
#[derive(Clone, PartialEq, Eq)]
pub struct MailAttachment {
    pub filename: String,
    pub mime: String,
    pub content: Vec<u8>,
}

impl std::fmt::Debug for MailAttachment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MailAttachment")
            .field("filename", &self.filename)
            .field("mime", &self.mime)
            .field("bytes", &self.content.len())
            .finish()
    }
}

/// One `Authentication-Results` header (RFC 8601): its server and the
/// results of the methods it names (`dmarc`, `dkim`, `spf`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuthResult {
    /// The server that added the header, lowercased: only the configured
    /// `authserv_id`'s headers are believed (anyone can add one to a mail).
    pub authserv_id: String,
    pub results: Vec<MethodResult>,
}

/// One method's result in an `Authentication-Results` header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MethodResult {
    /// `dkim`, `spf`, `dmarc`, …, lowercased.
    pub method: String,
    /// `pass`, `fail`, `softfail`, `none`, …, lowercased.
    pub result: String,
    /// The domain the result is about, lowercased: the signing domain for
    /// `dkim` (`header.d`), the envelope sender's domain for `spf`
    /// (`smtp.mailfrom`), the `From` domain for `dmarc` (`header.from`).
    pub domain: Option<String>,
}

/// Whether a sender is believed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SenderCheck {
    /// A check aligned with the `From` domain passed (or none is required
    /// and none failed).
    Trusted,
    /// A check failed: the `From` is forged.
    Forged,
    /// Authentication is required and no check passed.
    Unauthenticated,
}

/// Why a mail gets no run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    NoSender,
    NotAllowed,
    Forged,
    Unauthenticated,
    Automatic,
    OwnMail,
}

impl Refusal {
    pub fn as_str(self) -> &'static str {
        match self {
            Refusal::NoSender => "no single From address",
            Refusal::NotAllowed => "sender not in allowed_senders",
            Refusal::Forged => "sender authentication failed",
            Refusal::Unauthenticated => "sender not authenticated",
            Refusal::Automatic => "automatic mail",
            Refusal::OwnMail => "the gateway's own mail",
        }
    }
}

/// Parses a raw RFC 5322 mail; `None` when it is not one.
pub fn parse(raw: &[u8]) -> Option<InboundMail> {
    let message = MessageParser::default().parse(raw)?;
    let message_id = message
        .message_id()
        .map(clean_id)
        .filter(|id| !id.is_empty())
        .unwrap_or_else(|| format!("{}@content.invalid", short_hash(raw)));
    let ids = |value: &mail_parser::HeaderValue<'_>| -> Vec<String> {
        match value {
            mail_parser::HeaderValue::Text(text) => vec![clean_id(text)],
            mail_parser::HeaderValue::TextList(list) => list.iter().map(|t| clean_id(t)).collect(),
            _ => Vec::new(),
        }
        .into_iter()
        .filter(|id| !id.is_empty())
        .collect()
    };
    // Exactly one `From` header with exactly one address: with two, which
    // one a reader shows differs (the parser keeps the last), so neither is
    // believed.
    let from_headers =
        message.headers().iter().filter(|h| h.name.as_str().eq_ignore_ascii_case("From")).count();
    let from = match message.from() {
        Some(list) if from_headers == 1 && list.iter().count() == 1 => {
            list.first().and_then(|addr| addr.address()).and_then(parse_address)
        }
        _ => None,
    };
    let body = message.body_text(0).map(|text| text.into_owned()).unwrap_or_default();
    let mut attachments = Vec::new();
    for (index, part) in message.attachments().enumerate().take(MAX_ATTACHMENTS) {
        let mime = part
            .content_type()
            .map(|ct| match ct.subtype() {
                Some(sub) => format!("{}/{sub}", ct.ctype()),
                None => ct.ctype().to_owned(),
            })
            .unwrap_or_else(|| "application/octet-stream".to_owned())
            .to_ascii_lowercase();
        // An inline image often has no name, only a Content-ID.
        let filename = part
            .attachment_name()
            .map(safe_filename)
            .filter(|name| !name.is_empty())
            .unwrap_or_else(|| unnamed(index, &mime));
        attachments.push(MailAttachment { filename, mime, content: part.contents().to_vec() });
    }
    let mut auth = Vec::new();
    let mut automatic = false;
    for header in message.headers() {
        let name = header.name.as_str();
        let raw_value = raw.get(header.offset_start as usize..header.offset_end as usize);
        let value = raw_value.map(String::from_utf8_lossy).unwrap_or_default();
        if name.eq_ignore_ascii_case("Authentication-Results") {
            auth.extend(parse_auth_results(&value));
        } else if name.eq_ignore_ascii_case("Auto-Submitted") {
            automatic |= !value.trim().eq_ignore_ascii_case("no");
        } else if name.eq_ignore_ascii_case("Precedence") {
            let value = value.trim().to_ascii_lowercase();
            automatic |= matches!(value.as_str(), "bulk" | "junk" | "list" | "auto_reply");
        }
    }
    Some(InboundMail {
        message_id,
        in_reply_to: ids(message.in_reply_to()),
        references: ids(message.references()),
        from,
        subject: message.subject().unwrap_or_default().trim().to_owned(),
        text: strip_reply(&body),
        attachments,
        auth,
        automatic,
    })
}

/// The name of the `index`-th attachment when it has none: `image-1.png`
/// for an image, `attachment-1.pdf`, `attachment-1` for an unknown type.
fn unnamed(index: usize, mime: &str) -> String {
    let ext = match mime {
        "image/png" => ".png",
        "image/jpeg" | "image/jpg" => ".jpg",
        "image/gif" => ".gif",
        "image/webp" => ".webp",
        "application/pdf" => ".pdf",
        "text/plain" => ".txt",
        "text/csv" => ".csv",
        "application/json" => ".json",
        _ => "",
    };
    let stem = if mime.starts_with("image/") { "image" } else { "attachment" };
    format!("{stem}-{}{ext}", index + 1)
}

/// `<id@host>` → `id@host`, trimmed; control characters dropped.
fn clean_id(raw: &str) -> String {
    raw.trim()
        .trim_start_matches('<')
        .trim_end_matches('>')
        .chars()
        .filter(|c| !c.is_control())
        .collect()
}

/// The last path component of `name` with only safe characters, so it cannot
/// leave the folder it is saved in.
pub fn safe_filename(name: &str) -> String {
    let last = name.rsplit(['/', '\\']).next().unwrap_or_default();
    let cleaned: String = last
        .chars()
        .map(|c| if c.is_alphanumeric() || matches!(c, '.' | '-' | '_' | ' ') { c } else { '_' })
        .collect();
    let cleaned = cleaned.trim().trim_start_matches('.').to_owned();
    cleaned.chars().take(120).collect()
}

/// `mx.example.com; dkim=pass header.d=…; spf=fail …` → its server and
/// results. Comments (`(…)`) are dropped; each result keeps the domain it is
/// about (see [`MethodResult::domain`]).
pub fn parse_auth_results(value: &str) -> Option<AuthResult> {
    let unfolded: String = value.split(['\r', '\n']).collect::<Vec<_>>().join(" ");
    let plain = without_comments(&unfolded);
    let mut parts = plain.split(';');
    let authserv_id =
        parts.next()?.split_whitespace().next().unwrap_or_default().to_ascii_lowercase();
    if authserv_id.is_empty() {
        return None;
    }
    let results = parts.filter_map(parse_method_result).collect();
    Some(AuthResult { authserv_id, results })
}

/// `dkim=pass header.d=example.com header.s=sel` → its method, result and domain.
fn parse_method_result(part: &str) -> Option<MethodResult> {
    let mut words = part.split_whitespace();
    let (method, result) = words.next()?.split_once('=')?;
    let method = method.trim().to_ascii_lowercase();
    let property = match method.as_str() {
        "dkim" => "header.d",
        "spf" => "smtp.mailfrom",
        "dmarc" => "header.from",
        _ => "",
    };
    let domain = words
        .filter_map(|word| word.split_once('='))
        .find(|(key, _)| key.eq_ignore_ascii_case(property))
        .map(|(_, value)| {
            let value = value.trim_matches('"');
            // `smtp.mailfrom` is an address (or a bare domain).
            let domain = value.rsplit_once('@').map_or(value, |(_, domain)| domain);
            domain.trim_end_matches('.').to_ascii_lowercase()
        })
        .filter(|domain| !domain.is_empty());
    Some(MethodResult { method, result: result.trim().to_ascii_lowercase(), domain })
}

/// `text` without its `(…)` comments (nested ones too).
fn without_comments(text: &str) -> String {
    let mut depth = 0usize;
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '(' => depth += 1,
            ')' if depth > 0 => {
                depth -= 1;
                out.push(' ');
            }
            c if depth == 0 => out.push(c),
            _ => {}
        }
    }
    out
}

/// Whether `domain` (a result's) and `from_domain` (the `From` address's)
/// are aligned, relaxed: the same, or one a subdomain of the other
/// (`mail.example.com` and `example.com`). The shorter needs two labels at
/// least, so a bare top-level domain aligns with nothing.
pub fn aligned(domain: &str, from_domain: &str) -> bool {
    let (a, b) = (domain.trim_end_matches('.'), from_domain.trim_end_matches('.'));
    if a.is_empty() || b.is_empty() {
        return false;
    }
    if a.eq_ignore_ascii_case(b) {
        return true;
    }
    let (a, b) = (a.to_ascii_lowercase(), b.to_ascii_lowercase());
    let (short, long) = if a.len() < b.len() { (a, b) } else { (b, a) };
    short.contains('.') && long.ends_with(&format!(".{short}"))
}

/// Whether the sender `from` (a bare address) of a mail with these results is
/// believed.
///
/// Only the headers of `authserv_id` (the receiving server's own) are read:
/// anyone can add an `Authentication-Results` header to a mail, so without
/// an `authserv_id` none is. A `pass` counts only when its domain is
/// [`aligned`] with the `From` domain (DMARC's relaxed alignment); a failing
/// check refuses the mail unless another method passed aligned.
pub fn check_sender(
    auth: &[AuthResult],
    from: &str,
    authserv_id: Option<&str>,
    required: bool,
) -> SenderCheck {
    let from_domain = from.rsplit_once('@').map(|(_, domain)| domain).unwrap_or_default();
    let results: Vec<&MethodResult> = match authserv_id {
        Some(id) => auth
            .iter()
            .filter(|r| r.authserv_id.eq_ignore_ascii_case(id.trim()))
            .flat_map(|r| r.results.iter())
            .collect(),
        None => Vec::new(),
    };
    let of = |method: &'static str| results.iter().filter(move |r| r.method == method);
    let passed = |method: &'static str| {
        of(method).any(|r| {
            r.result == "pass" && r.domain.as_deref().is_some_and(|d| aligned(d, from_domain))
        })
    };
    let failed =
        |method: &'static str| of(method).any(|r| matches!(r.result.as_str(), "fail" | "softfail"));
    if failed("dmarc") || (failed("spf") && !passed("dkim")) || (failed("dkim") && !passed("spf")) {
        return SenderCheck::Forged;
    }
    if required && !(passed("dmarc") || passed("dkim") || passed("spf")) {
        return SenderCheck::Unauthenticated;
    }
    SenderCheck::Trusted
}

/// The new text of a reply: the quoted part (`> …` lines and the "On …
/// wrote:" line before them, or a forwarded "Original Message" block) and the
/// signature (after `-- `, "Sent from my …") removed.
pub fn strip_reply(body: &str) -> String {
    let body = body.replace("\r\n", "\n");
    let lines: Vec<&str> = body.lines().collect();
    let mut kept: Vec<&str> = Vec::new();
    for (index, line) in lines.iter().enumerate() {
        let trimmed = line.trim();
        // The signature separator ends the new text ("-- " by RFC 3676).
        if *line == "-- " || trimmed == "--" || trimmed == "__" {
            break;
        }
        if is_original_message_marker(trimmed) {
            break;
        }
        if is_attribution(trimmed, &lines[index + 1..]) {
            break;
        }
        if trimmed.starts_with('>') {
            continue;
        }
        kept.push(line);
    }
    while kept.last().is_some_and(|l| l.trim().is_empty() || is_mobile_signature(l.trim())) {
        kept.pop();
    }
    let text = kept.join("\n");
    text.trim().to_owned()
}

fn is_original_message_marker(line: &str) -> bool {
    let lower = line.to_ascii_lowercase();
    let marker = lower.trim_matches(|c: char| c == '-' || c == '_' || c.is_whitespace());
    (line.starts_with("---") || line.starts_with("___"))
        && matches!(marker, "original message" | "forwarded message" | "reply message")
}

/// "On Tue, 1 Dec 2026, Alice <a@b.c> wrote:" (possibly wrapped over two
/// lines), followed by quoted lines.
fn is_attribution(line: &str, rest: &[&str]) -> bool {
    let ends = |l: &str| l.trim_end().ends_with("wrote:") || l.trim_end().ends_with("schrieb:");
    let starts = line.starts_with("On ") || line.starts_with("Am ") || line.starts_with("Le ");
    let quoted_next = |from: usize| {
        rest.iter()
            .skip(from)
            .find(|l| !l.trim().is_empty())
            .is_none_or(|l| l.trim_start().starts_with('>'))
    };
    if starts && ends(line) {
        return quoted_next(0);
    }
    if starts && rest.first().is_some_and(|next| ends(next)) {
        return quoted_next(1);
    }
    false
}

fn is_mobile_signature(line: &str) -> bool {
    let lower = line.to_ascii_lowercase();
    lower.starts_with("sent from my ") || lower.starts_with("get outlook for ")
}

/// The ids a mail points back to, nearest first: `In-Reply-To`, then
/// `References` newest to oldest.
pub fn ancestors(mail: &InboundMail) -> Vec<&str> {
    let mut ids: Vec<&str> = mail.in_reply_to.iter().map(String::as_str).collect();
    for id in mail.references.iter().rev() {
        if !ids.contains(&id.as_str()) {
            ids.push(id);
        }
    }
    ids
}

/// The thread a mail starts or continues when none of its ancestors is known:
/// the oldest `References` entry, else `In-Reply-To`, else itself.
pub fn thread_root(mail: &InboundMail) -> &str {
    mail.references
        .first()
        .or(mail.in_reply_to.first())
        .map(String::as_str)
        .unwrap_or(&mail.message_id)
}

/// A short, stable name of a thread root for keys: 20 hex digits of its SHA-256.
pub fn thread_id(root: &str) -> String {
    short_hash(root.as_bytes())
}

fn short_hash(bytes: &[u8]) -> String {
    let digest = Sha256::digest(bytes);
    digest.iter().take(10).map(|b| format!("{b:02x}")).collect()
}

/// `agent:<agent_id>:email:<thread>`, checked.
pub fn session_key(agent_id: &str, thread: &str) -> Option<SessionKey> {
    let key = format!("agent:{agent_id}:{TRANSPORT_ID}:{thread}");
    let shaped = key.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, ':' | '-' | '_'));
    shaped.then(|| SessionKey::parse(&key).ok()).flatten()
}

/// The thread a session key of this transport names ([`session_key`]'s inverse).
pub fn thread_of(session_key: &str) -> Option<&str> {
    let parts: Vec<&str> = session_key.split(':').collect();
    match parts.as_slice() {
        ["agent", _, TRANSPORT_ID, thread]
            if thread.len() == 20 && thread.chars().all(|c| c.is_ascii_hexdigit()) =>
        {
            Some(thread)
        }
        _ => None,
    }
}

/// The run of a mail: the same mail (by `Message-ID`) is always the same run,
/// whether it came by IMAP or by the webhook, once or twice.
pub fn run_id(mail: &InboundMail) -> RunId {
    RunId::parse(&format!("email_{}", short_hash(mail.message_id.as_bytes())))
        .unwrap_or_else(RunId::generate)
}

/// `Re: <subject>`, without piling up `Re:`s.
pub fn reply_subject(subject: &str) -> String {
    let trimmed = subject.trim();
    let lower = trimmed.to_ascii_lowercase();
    if lower.starts_with("re:") || lower.starts_with("aw:") {
        return trimmed.to_owned();
    }
    if trimmed.is_empty() {
        return "Re: your message".to_owned();
    }
    format!("Re: {trimmed}")
}

/// The prompt of a mail: its text (the subject when the text is empty; a
/// default when both are and files came), then the attachments that were not
/// kept (`not_kept`: the index of each in `mail.attachments`, with why). The
/// kept ones are named by the note the run adds once they are in its
/// uploads directory.
pub fn prompt(mail: &InboundMail, not_kept: &[(usize, String)]) -> String {
    let mut prompt = if mail.text.is_empty() { mail.subject.clone() } else { mail.text.clone() };
    if prompt.trim().is_empty() && !mail.attachments.is_empty() {
        crate::media::FILES_ONLY_PROMPT.clone_into(&mut prompt);
    }
    if !not_kept.is_empty() {
        prompt.push_str("\n\nAttachments not saved:");
        for (index, why) in not_kept {
            let Some(attachment) = mail.attachments.get(*index) else { continue };
            prompt.push_str(&format!(
                "\n- {} ({}, {}): {why}",
                attachment.filename,
                attachment.mime,
                lemon_core::media::size_text(attachment.content.len() as u64)
            ));
        }
    }
    prompt
}

#[cfg(test)]
mod tests;
