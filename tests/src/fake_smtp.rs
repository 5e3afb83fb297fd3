//! A fake SMTP server on loopback (RFC 5321): greeting, `EHLO`/`HELO`,
//! `AUTH PLAIN` / `AUTH LOGIN`, `MAIL FROM`, `RCPT TO`, `DATA` with dot
//! stuffing, `RSET`, `NOOP`, `QUIT`. It keeps every mail it accepted, and
//! reads what tests need from them with its own small MIME reader.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine as _;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// One accepted mail: its envelope and its text.
#[derive(Debug, Clone)]
pub struct SmtpMail {
    pub auth: Option<(String, String)>,
    pub mail_from: String,
    pub rcpt_to: Vec<String>,
    /// The mail as sent, dot stuffing undone, CRLF line ends.
    pub data: String,
}

impl SmtpMail {
    /// The value of header `name` (unfolded), if present.
    pub fn header(&self, name: &str) -> Option<String> {
        header_of(self.head(), name)
    }

    fn head(&self) -> &str {
        self.data.split("\r\n\r\n").next().unwrap_or_default()
    }

    /// The decoded body of the first part of `mime` type (`text/plain`,
    /// `text/html`), looking into multipart bodies.
    pub fn part(&self, mime: &str) -> Option<String> {
        find_part(&self.data, mime)
    }
}

fn header_of(head: &str, name: &str) -> Option<String> {
    let mut found: Option<String> = None;
    let mut current: Option<String> = None;
    for line in head.split("\r\n") {
        if line.starts_with([' ', '\t']) {
            if let Some(value) = current.as_mut() {
                value.push(' ');
                value.push_str(line.trim());
            }
            continue;
        }
        if let Some(value) = current.take() {
            found.get_or_insert(value);
        }
        if let Some((key, value)) = line.split_once(':') {
            if key.trim().eq_ignore_ascii_case(name) {
                current = Some(value.trim().to_owned());
            }
        }
    }
    if let Some(value) = current {
        found.get_or_insert(value);
    }
    found
}

fn find_part(entity: &str, mime: &str) -> Option<String> {
    let (head, body) = entity.split_once("\r\n\r\n").unwrap_or((entity, ""));
    let content_type = header_of(head, "Content-Type").unwrap_or_else(|| "text/plain".into());
    let lower = content_type.to_ascii_lowercase();
    if lower.starts_with("multipart/") {
        let boundary = content_type
            .split(';')
            .filter_map(|p| p.trim().split_once('='))
            .find(|(k, _)| k.trim().eq_ignore_ascii_case("boundary"))
            .map(|(_, v)| v.trim().trim_matches('"').to_owned())?;
        let delimiter = format!("--{boundary}");
        for part in body.split(&delimiter).skip(1) {
            if part.starts_with("--") {
                break;
            }
            let part = part.strip_prefix("\r\n").unwrap_or(part);
            if let Some(found) = find_part(part, mime) {
                return Some(found);
            }
        }
        return None;
    }
    if !lower.starts_with(mime) {
        return None;
    }
    let encoding = header_of(head, "Content-Transfer-Encoding").unwrap_or_default();
    let body = body.trim_end_matches("\r\n");
    let decoded = match encoding.to_ascii_lowercase().as_str() {
        "base64" => {
            let joined: String = body.split_whitespace().collect();
            let bytes = base64::engine::general_purpose::STANDARD.decode(joined).ok()?;
            String::from_utf8_lossy(&bytes).into_owned()
        }
        "quoted-printable" => decode_quoted_printable(body),
        _ => body.to_owned(),
    };
    Some(decoded.replace("\r\n", "\n"))
}

fn decode_quoted_printable(text: &str) -> String {
    let mut bytes = Vec::new();
    let mut lines = text.split("\r\n").peekable();
    while let Some(line) = lines.next() {
        let (line, soft) = match line.strip_suffix('=') {
            Some(rest) => (rest, true),
            None => (line, false),
        };
        let raw = line.as_bytes();
        let mut i = 0;
        while i < raw.len() {
            if raw[i] == b'=' && i + 2 < raw.len() {
                let hex = std::str::from_utf8(&raw[i + 1..i + 3]).unwrap_or("");
                if let Ok(b) = u8::from_str_radix(hex, 16) {
                    bytes.push(b);
                    i += 3;
                    continue;
                }
            }
            bytes.push(raw[i]);
            i += 1;
        }
        if !soft && lines.peek().is_some() {
            bytes.extend_from_slice(b"\r\n");
        }
    }
    String::from_utf8_lossy(&bytes).into_owned()
}

#[derive(Debug, Default)]
struct State {
    mails: Vec<SmtpMail>,
    /// Mails to refuse with a 451 before accepting again.
    refuse_next: usize,
    /// Connections that completed a TLS handshake.
    n_tls: usize,
}

/// The fake server; stops when dropped.
#[derive(Debug)]
pub struct FakeSmtp {
    port: u16,
    state: Arc<Mutex<State>>,
    changes: watch::Sender<u64>,
    task: JoinHandle<()>,
}

impl Drop for FakeSmtp {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl FakeSmtp {
    /// Starts on `127.0.0.1:0`.
    ///
    /// # Panics
    /// When it cannot bind.
    pub async fn start() -> FakeSmtp {
        FakeSmtp::start_with(None).await
    }

    /// Starts one that speaks SMTP only inside TLS from the first byte (port
    /// 465 style) with `cert`.
    pub async fn start_tls(cert: &crate::tls_cert::TestCert) -> FakeSmtp {
        use tokio_rustls::rustls;
        use tokio_rustls::rustls::pki_types::pem::PemObject;
        let chain = rustls::pki_types::CertificateDer::pem_file_iter(&cert.cert)
            .expect("cert file")
            .collect::<Result<Vec<_>, _>>()
            .expect("cert");
        let key = rustls::pki_types::PrivateKeyDer::from_pem_file(&cert.key).expect("key");
        let config = rustls::ServerConfig::builder_with_provider(std::sync::Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .expect("TLS versions")
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .expect("server config");
        FakeSmtp::start_with(Some(tokio_rustls::TlsAcceptor::from(Arc::new(config)))).await
    }

    async fn start_with(tls: Option<tokio_rustls::TlsAcceptor>) -> FakeSmtp {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind the fake SMTP server");
        let port = listener.local_addr().expect("local addr").port();
        let state = Arc::new(Mutex::new(State::default()));
        let (changes, _) = watch::channel(0u64);
        let task = {
            let state = state.clone();
            let changes = changes.clone();
            tokio::spawn(async move {
                while let Ok((stream, _)) = listener.accept().await {
                    let state = state.clone();
                    let changes = changes.clone();
                    let tls = tls.clone();
                    tokio::spawn(async move {
                        let _ = match tls {
                            Some(acceptor) => match acceptor.accept(stream).await {
                                Ok(stream) => {
                                    state.lock().unwrap().n_tls += 1;
                                    serve(stream, state, changes).await
                                }
                                Err(_) => Ok(()),
                            },
                            None => serve(stream, state, changes).await,
                        };
                    });
                }
            })
        };
        FakeSmtp { port, state, changes, task }
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// Every mail accepted so far.
    pub fn mails(&self) -> Vec<SmtpMail> {
        self.state.lock().unwrap().mails.clone()
    }

    /// Connections that completed a TLS handshake (with [`FakeSmtp::start_tls`]).
    pub fn tls_connections(&self) -> usize {
        self.state.lock().unwrap().n_tls
    }

    /// The next `n` mails get `451` (try again later) after their data.
    pub fn refuse_next(&self, n: usize) {
        self.state.lock().unwrap().refuse_next = n;
    }

    /// Waits until `done` holds for the accepted mails.
    ///
    /// # Panics
    /// When it does not within `patience`.
    pub async fn wait_for(
        &self,
        what: &str,
        patience: Duration,
        done: impl Fn(&[SmtpMail]) -> bool,
    ) -> Vec<SmtpMail> {
        let mut changes = self.changes.subscribe();
        let deadline = tokio::time::Instant::now() + patience;
        loop {
            changes.borrow_and_update();
            let mails = self.mails();
            if done(&mails) {
                return mails;
            }
            if tokio::time::timeout_at(deadline, changes.changed()).await.is_err() {
                panic!("timed out after {patience:?} waiting for {what}; mails: {mails:#?}");
            }
        }
    }
}

async fn serve<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(
    stream: S,
    state: Arc<Mutex<State>>,
    changes: watch::Sender<u64>,
) -> std::io::Result<()> {
    let (read, mut write) = tokio::io::split(stream);
    let mut lines = BufReader::new(read);
    write.write_all(b"220 fake-smtp.test ESMTP ready\r\n").await?;
    let mut auth: Option<(String, String)> = None;
    let mut mail_from: Option<String> = None;
    let mut rcpt_to: Vec<String> = Vec::new();
    let b64 = base64::engine::general_purpose::STANDARD;
    loop {
        let mut line = String::new();
        if lines.read_line(&mut line).await? == 0 {
            return Ok(());
        }
        let line = line.trim_end_matches(['\r', '\n']);
        let upper = line.to_ascii_uppercase();
        let reply: String = if upper.starts_with("EHLO") {
            "250-fake-smtp.test\r\n250-AUTH PLAIN LOGIN\r\n250-8BITMIME\r\n250 SIZE 10485760\r\n"
                .into()
        } else if upper.starts_with("HELO") {
            "250 fake-smtp.test\r\n".into()
        } else if upper.starts_with("AUTH PLAIN") {
            let mut encoded = line[10..].trim().to_owned();
            if encoded.is_empty() {
                write.write_all(b"334 \r\n").await?;
                let mut next = String::new();
                lines.read_line(&mut next).await?;
                encoded = next.trim().to_owned();
            }
            let decoded = b64.decode(encoded).unwrap_or_default();
            let parts: Vec<String> = decoded
                .split(|b| *b == 0)
                .map(|p| String::from_utf8_lossy(p).into_owned())
                .collect();
            match parts.as_slice() {
                [_, user, pass] => {
                    auth = Some((user.clone(), pass.clone()));
                    "235 2.7.0 Authentication successful\r\n".into()
                }
                _ => "501 5.5.2 malformed AUTH PLAIN\r\n".into(),
            }
        } else if upper.starts_with("AUTH LOGIN") {
            write.write_all(b"334 VXNlcm5hbWU6\r\n").await?;
            let mut user = String::new();
            lines.read_line(&mut user).await?;
            write.write_all(b"334 UGFzc3dvcmQ6\r\n").await?;
            let mut pass = String::new();
            lines.read_line(&mut pass).await?;
            let text = |s: &str| {
                String::from_utf8_lossy(&b64.decode(s.trim()).unwrap_or_default()).into_owned()
            };
            auth = Some((text(&user), text(&pass)));
            "235 2.7.0 Authentication successful\r\n".into()
        } else if upper.starts_with("MAIL FROM:") {
            mail_from = Some(address_in(&line[10..]));
            rcpt_to.clear();
            "250 2.1.0 Ok\r\n".into()
        } else if upper.starts_with("RCPT TO:") {
            if mail_from.is_none() {
                "503 5.5.1 MAIL first\r\n".into()
            } else {
                rcpt_to.push(address_in(&line[8..]));
                "250 2.1.5 Ok\r\n".into()
            }
        } else if upper == "DATA" {
            if rcpt_to.is_empty() {
                "503 5.5.1 RCPT first\r\n".into()
            } else {
                write.write_all(b"354 End data with <CR><LF>.<CR><LF>\r\n").await?;
                let mut data = String::new();
                loop {
                    let mut next = String::new();
                    if lines.read_line(&mut next).await? == 0 {
                        return Ok(());
                    }
                    let content = next.trim_end_matches(['\r', '\n']);
                    if content == "." {
                        break;
                    }
                    let content = content.strip_prefix('.').unwrap_or(content);
                    data.push_str(content);
                    data.push_str("\r\n");
                }
                let refused = {
                    let mut state = state.lock().unwrap();
                    if state.refuse_next > 0 {
                        state.refuse_next -= 1;
                        true
                    } else {
                        state.mails.push(SmtpMail {
                            auth: auth.clone(),
                            mail_from: mail_from.clone().unwrap_or_default(),
                            rcpt_to: rcpt_to.clone(),
                            data,
                        });
                        false
                    }
                };
                mail_from = None;
                rcpt_to.clear();
                if refused {
                    "451 4.3.0 try again later\r\n".into()
                } else {
                    changes.send_modify(|n| *n += 1);
                    "250 2.0.0 Ok: queued\r\n".into()
                }
            }
        } else if upper == "RSET" {
            mail_from = None;
            rcpt_to.clear();
            "250 2.0.0 Ok\r\n".into()
        } else if upper == "NOOP" {
            "250 2.0.0 Ok\r\n".into()
        } else if upper == "QUIT" {
            write.write_all(b"221 2.0.0 Bye\r\n").await?;
            return Ok(());
        } else {
            "502 5.5.2 command not recognized\r\n".into()
        };
        write.write_all(reply.as_bytes()).await?;
    }
}

/// `<a@b.c> SIZE=10` → `a@b.c`.
fn address_in(arg: &str) -> String {
    let arg = arg.trim();
    match (arg.find('<'), arg.find('>')) {
        (Some(open), Some(close)) if open < close => arg[open + 1..close].to_owned(),
        _ => arg.split_whitespace().next().unwrap_or_default().to_owned(),
    }
}
