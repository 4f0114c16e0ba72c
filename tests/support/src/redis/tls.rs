//! A throwaway certificate authority for the TLS tests.

use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;

use super::TempDir;

/// A throwaway certificate authority and a server certificate it signed for `127.0.0.1` and
/// `localhost`, written by the `openssl` command (`./scripts/test.sh` installs it).
#[derive(Clone)]
pub struct TlsFiles {
    /// The files' folder, removed when the last clone is dropped.
    _dir: Arc<TempDir>,
    pub ca_cert: PathBuf,
    pub server_cert: PathBuf,
    pub server_key: PathBuf,
}

impl TlsFiles {
    pub fn generate() -> Self {
        let dir = TempDir::new("tls");
        let path = |name: &str| dir.path().join(name);
        let openssl = |args: &[&str]| {
            let output = Command::new("openssl")
                .args(args)
                .current_dir(dir.path())
                .output()
                .unwrap_or_else(|e| {
                    panic!("cannot run openssl ({e}); install it, e.g. with ./scripts/test.sh")
                });
            assert!(
                output.status.success(),
                "openssl {args:?} failed: {}",
                String::from_utf8_lossy(&output.stderr)
            );
        };
        let ec = [
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
        ];
        openssl(
            &[
                &[
                    "req",
                    "-x509",
                    "-new",
                    "-days",
                    "2",
                    "-subj",
                    "/CN=tower-stampede test CA",
                ][..],
                &ec,
                &["-keyout", "ca.key", "-out", "ca.crt"],
            ]
            .concat(),
        );
        openssl(
            &[
                &["req", "-new", "-subj", "/CN=127.0.0.1"][..],
                &ec,
                &["-keyout", "server.key", "-out", "server.csr"],
            ]
            .concat(),
        );
        std::fs::write(
            path("server.ext"),
            "basicConstraints=CA:FALSE\n\
             keyUsage=digitalSignature\n\
             extendedKeyUsage=serverAuth,clientAuth\n\
             subjectAltName=IP:127.0.0.1,DNS:localhost\n",
        )
        .expect("write server.ext");
        openssl(&[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "2",
            "-extfile",
            "server.ext",
            "-out",
            "server.crt",
        ]);
        TlsFiles {
            ca_cert: path("ca.crt"),
            server_cert: path("server.crt"),
            server_key: path("server.key"),
            _dir: Arc::new(dir),
        }
    }

    /// The `redis-server` arguments that give a server (or sentinel) this certificate, trust this
    /// authority, and accept clients without certificates; the TLS port is given apart.
    pub(super) fn server_args(&self) -> Vec<std::ffi::OsString> {
        let mut args: Vec<std::ffi::OsString> = Vec::new();
        for (name, file) in [
            ("--tls-cert-file", &self.server_cert),
            ("--tls-key-file", &self.server_key),
            ("--tls-ca-cert-file", &self.ca_cert),
        ] {
            args.push(name.into());
            args.push(file.into());
        }
        args.extend(["--tls-auth-clients".into(), "no".into()]);
        args
    }
}
