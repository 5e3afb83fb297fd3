//! A self-signed certificate for `127.0.0.1` and `localhost`, made by
//! `openssl` for a test's TLS servers (Dovecot, the fake SMTP server).

use std::path::{Path, PathBuf};

/// A test CA, and a server certificate it signed with its key; PEM files in a
/// folder of the test.
#[derive(Debug, Clone)]
pub struct TestCert {
    /// The CA's certificate: what a client is told to trust.
    pub ca: PathBuf,
    /// The server's certificate (for 127.0.0.1 and localhost).
    pub cert: PathBuf,
    pub key: PathBuf,
}

fn openssl(args: &[&str], dir: &Path) {
    #[allow(clippy::disallowed_methods)] // tests make their own certificates
    let status = std::process::Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .expect("openssl runs");
    assert!(status.success(), "openssl {args:?} failed");
}

impl TestCert {
    /// Makes one in `dir`.
    ///
    /// # Panics
    /// When `openssl` is missing or fails.
    pub fn make(dir: &Path) -> TestCert {
        std::fs::write(
            dir.join("server.ext"),
            "basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\n\
             extendedKeyUsage=serverAuth\nsubjectAltName=IP:127.0.0.1,DNS:localhost\n",
        )
        .expect("extensions file");
        openssl(
            &[
                "req",
                "-x509",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-days",
                "2",
                "-subj",
                "/CN=lemon test CA",
            ]
            .into_iter()
            .chain(["-keyout", "ca-key.pem", "-out", "ca.pem"])
            .collect::<Vec<_>>(),
            dir,
        );
        openssl(
            &[
                "req",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-subj",
                "/CN=127.0.0.1",
                "-keyout",
                "key.pem",
                "-out",
                "server.csr",
            ],
            dir,
        );
        openssl(
            &[
                "x509",
                "-req",
                "-in",
                "server.csr",
                "-CA",
                "ca.pem",
                "-CAkey",
                "ca-key.pem",
                "-CAcreateserial",
                "-days",
                "2",
                "-extfile",
                "server.ext",
                "-out",
                "cert.pem",
            ],
            dir,
        );
        let key = dir.join("key.pem");
        // Dovecot reads the key as another user when the tests run as root.
        std::fs::set_permissions(&key, std::os::unix::fs::PermissionsExt::from_mode(0o644))
            .expect("chmod key");
        TestCert { ca: dir.join("ca.pem"), cert: dir.join("cert.pem"), key }
    }
}
