//! A real IMAP server for tests: Debian's Dovecot (`dovecot-imapd`), started
//! with a config of its own in a temporary directory, plain IMAP on a free
//! 127.0.0.1 port, one user from a passwd-file, mail in Maildir. Mail is put
//! in with IMAP `APPEND`, as any client would.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::process::{Child, Command};

/// Where Debian installs the server.
pub const DOVECOT_BIN: &str = "/usr/sbin/dovecot";

/// The one user.
pub const USER: &str = "lemon";
pub const PASSWORD: &str = "imap-pass-7c1e";

/// A running Dovecot; stopped when dropped.
#[derive(Debug)]
pub struct Dovecot {
    child: Child,
    port: u16,
    dir: tempfile::TempDir,
}

/// Our uid and gid: those of a file we just made.
fn own_ids(dir: &Path) -> (u32, u32) {
    use std::os::unix::fs::MetadataExt;
    let probe = dir.join(".owner");
    std::fs::write(&probe, b"").expect("probe file");
    let meta = std::fs::metadata(&probe).expect("probe metadata");
    (meta.uid(), meta.gid())
}

/// `/etc/passwd`'s (name, uid, gid) entries.
fn passwd() -> Vec<(String, u32, u32)> {
    let text = std::fs::read_to_string("/etc/passwd").unwrap_or_default();
    text.lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split(':').collect();
            Some((
                fields.first()?.to_string(),
                fields.get(2)?.parse().ok()?,
                fields.get(3)?.parse().ok()?,
            ))
        })
        .collect()
}

/// The uid and gid mail is stored under: ours, or Dovecot's own user when we
/// are root (Dovecot refuses to store mail as root).
fn mail_owner(own: (u32, u32)) -> (u32, u32) {
    if own.0 != 0 {
        return own;
    }
    passwd()
        .into_iter()
        .find(|(name, _, _)| name == "dovecot")
        .map(|(_, uid, gid)| (uid, gid))
        .unwrap_or((65534, 65534))
}

fn user_name(uid: u32) -> String {
    passwd()
        .into_iter()
        .find(|(_, id, _)| *id == uid)
        .map(|(name, _, _)| name)
        .unwrap_or_else(|| "nobody".to_owned())
}

fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
    listener.local_addr().expect("addr").port()
}

impl Dovecot {
    /// Starts Dovecot and waits until it greets.
    ///
    /// # Panics
    /// When Dovecot is not installed (`apt-get install dovecot-imapd`) or does
    /// not start within `patience`.
    pub async fn start(patience: Duration) -> Dovecot {
        Dovecot::start_with(patience, None).await
    }

    /// Starts one that speaks only IMAP over implicit TLS (`ssl = required`)
    /// with `cert`.
    pub async fn start_tls(patience: Duration, cert: &crate::tls_cert::TestCert) -> Dovecot {
        Dovecot::start_with(patience, Some(cert)).await
    }

    async fn start_with(patience: Duration, tls: Option<&crate::tls_cert::TestCert>) -> Dovecot {
        assert!(
            Path::new(DOVECOT_BIN).exists(),
            "{DOVECOT_BIN} is missing: install Debian's dovecot-imapd (scripts/test does)"
        );
        let dir = tempfile::Builder::new().prefix("lemon-dovecot").tempdir().expect("tempdir");
        let root = dir.path().to_path_buf();
        let own = own_ids(&root);
        let (uid, gid) = mail_owner(own);
        let running_as_root = own.0 == 0;
        let mail = root.join("mail");
        std::fs::create_dir_all(&mail).expect("mail dir");
        std::fs::create_dir_all(root.join("run")).expect("run dir");
        std::fs::create_dir_all(root.join("state")).expect("state dir");
        // Dovecot's processes (other users when we are root) walk into it.
        std::fs::set_permissions(&root, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .expect("chmod");
        if running_as_root {
            std::os::unix::fs::chown(&mail, Some(uid), Some(gid)).expect("chown mail dir");
        }
        std::fs::write(root.join("passwd"), format!("{USER}:{{PLAIN}}{PASSWORD}::::::\n"))
            .expect("passwd");
        let port = free_port();
        let me = user_name(own.0);
        let (internal, login) = if running_as_root {
            ("dovecot".to_owned(), "dovenull".to_owned())
        } else {
            (me.clone(), me)
        };
        let root_text = root.display();
        let (ssl, plain_port, tls_port) = match tls {
            Some(cert) => (
                format!(
                    "ssl = required\nssl_cert = <{}\nssl_key = <{}\n",
                    cert.cert.display(),
                    cert.key.display()
                ),
                0,
                port,
            ),
            None => ("ssl = no\n".to_owned(), port, 0),
        };
        let config = format!(
            "protocols = imap\n\
             listen = 127.0.0.1\n\
             base_dir = {root_text}/run\n\
             state_dir = {root_text}/state\n\
             log_path = {root_text}/dovecot.log\n\
             {ssl}\
             disable_plaintext_auth = no\n\
             auth_mechanisms = plain login\n\
             mail_location = maildir:~/Maildir\n\
             mailbox_idle_check_interval = 1 secs\n\
             first_valid_uid = 1\n\
             default_internal_user = {internal}\n\
             default_login_user = {login}\n\
             passdb {{\n  driver = passwd-file\n  args = scheme=PLAIN username_format=%u {root_text}/passwd\n}}\n\
             userdb {{\n  driver = static\n  args = uid={uid} gid={gid} home={root_text}/mail/%u\n}}\n\
             service imap-login {{\n  chroot =\n  inet_listener imap {{\n    address = 127.0.0.1\n    port = {plain_port}\n  }}\n  inet_listener imaps {{\n    address = 127.0.0.1\n    port = {tls_port}\n  }}\n}}\n\
             service anvil {{\n  chroot =\n}}\n\
             service stats {{\n  inet_listener http {{\n    port = 0\n  }}\n}}\n"
        );
        let config_path = root.join("dovecot.conf");
        std::fs::write(&config_path, config).expect("dovecot.conf");
        #[allow(clippy::disallowed_methods)] // tests start their own servers
        let child = Command::new(DOVECOT_BIN)
            .arg("-F")
            .arg("-c")
            .arg(&config_path)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("start dovecot");
        let dovecot = Dovecot { child, port, dir };
        let deadline = tokio::time::Instant::now() + patience;
        loop {
            if let Ok(Ok(stream)) = tokio::time::timeout(
                Duration::from_secs(2),
                TcpStream::connect(("127.0.0.1", port)),
            )
            .await
            {
                // Over TLS the greeting follows a handshake: a listener is enough.
                if tls.is_some() {
                    return dovecot;
                }
                let mut lines = BufReader::new(stream);
                let mut greeting = String::new();
                let read =
                    tokio::time::timeout(Duration::from_secs(5), lines.read_line(&mut greeting));
                if matches!(read.await, Ok(Ok(n)) if n > 0) && greeting.starts_with("* OK") {
                    return dovecot;
                }
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "dovecot did not start: {}",
                dovecot.log()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn dir(&self) -> PathBuf {
        self.dir.path().to_path_buf()
    }

    /// Dovecot's log so far, for failure messages.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("dovecot.log")).unwrap_or_default()
    }

    /// Puts `raw` (an RFC 5322 mail) into `INBOX` with `APPEND`.
    ///
    /// # Panics
    /// When the server does not take it.
    pub async fn append(&self, raw: &str) {
        let stream =
            TcpStream::connect(("127.0.0.1", self.port)).await.expect("connect to dovecot");
        self.append_over(stream, raw).await;
    }

    /// [`Dovecot::append`] to one started with [`Dovecot::start_tls`], trusting `cert`.
    pub async fn append_tls(&self, raw: &str, cert: &crate::tls_cert::TestCert) {
        use tokio_rustls::rustls;
        use tokio_rustls::rustls::pki_types::pem::PemObject;
        let mut roots = rustls::RootCertStore::empty();
        for der in rustls::pki_types::CertificateDer::pem_file_iter(&cert.ca).expect("cert") {
            roots.add(der.expect("cert")).expect("root");
        }
        let config = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .expect("TLS versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
        let tcp = TcpStream::connect(("127.0.0.1", self.port)).await.expect("connect to dovecot");
        let name = rustls::pki_types::ServerName::try_from("127.0.0.1").expect("name");
        let stream = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config))
            .connect(name, tcp)
            .await
            .expect("TLS with dovecot");
        self.append_over(stream, raw).await;
    }

    async fn append_over<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(
        &self,
        stream: S,
        raw: &str,
    ) {
        let raw = raw.replace("\r\n", "\n").replace('\n', "\r\n");
        let (read, mut write) = tokio::io::split(stream);
        let mut lines = BufReader::new(read);
        let mut line = String::new();
        lines.read_line(&mut line).await.expect("greeting");
        write.write_all(format!("a1 LOGIN {USER} {PASSWORD}\r\n").as_bytes()).await.unwrap();
        expect_ok("a1", &mut lines, self).await;
        write.write_all(format!("a2 APPEND INBOX {{{}}}\r\n", raw.len()).as_bytes()).await.unwrap();
        let mut go_ahead = String::new();
        lines.read_line(&mut go_ahead).await.unwrap();
        assert!(go_ahead.starts_with('+'), "APPEND: {go_ahead}");
        write.write_all(raw.as_bytes()).await.unwrap();
        write.write_all(b"\r\n").await.unwrap();
        expect_ok("a2", &mut lines, self).await;
        write.write_all(b"a3 LOGOUT\r\n").await.unwrap();
        let _ = write.shutdown().await;
    }
}

impl Drop for Dovecot {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
    }
}

/// Reads until the tagged answer to `tag`, which must be `OK`.
async fn expect_ok<R: tokio::io::AsyncRead + Unpin>(
    tag: &str,
    lines: &mut BufReader<R>,
    dovecot: &Dovecot,
) {
    loop {
        let mut line = String::new();
        let n = lines.read_line(&mut line).await.expect("read");
        assert!(n > 0, "dovecot closed the connection\n{}", dovecot.log());
        if let Some(rest) = line.strip_prefix(&format!("{tag} ")) {
            assert!(rest.starts_with("OK"), "{tag}: {line}\n{}", dovecot.log());
            return;
        }
    }
}
