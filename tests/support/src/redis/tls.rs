//! A throwaway certificate authority for the TLS tests, made with rcgen (no `openssl`
//! command needed).

use std::path::PathBuf;
use std::sync::Arc;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};

use super::TempDir;

/// A throwaway certificate authority and a server certificate it signed for `127.0.0.1` and
/// `localhost` (ECDSA P-256 keys), written as PEM files for `redis-server`.
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
        let write = |name: &str, pem: String| {
            std::fs::write(path(name), pem).unwrap_or_else(|e| panic!("write {name}: {e}"));
        };

        let ca_key = KeyPair::generate().expect("a CA key");
        let mut ca = CertificateParams::new(Vec::<String>::new()).expect("CA parameters");
        ca.distinguished_name
            .push(DnType::CommonName, "tower-stampede test CA");
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        write("ca.crt", ca.self_signed(&ca_key).expect("the CA").pem());

        let server_key = KeyPair::generate().expect("a server key");
        let mut server =
            CertificateParams::new(vec!["localhost".to_owned()]).expect("server parameters");
        server
            .subject_alt_names
            .push(SanType::IpAddress([127, 0, 0, 1].into()));
        server
            .distinguished_name
            .push(DnType::CommonName, "127.0.0.1");
        server.is_ca = IsCa::ExplicitNoCa;
        server.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        server.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let issuer = Issuer::new(ca, ca_key);
        let signed = server
            .signed_by(&server_key, &issuer)
            .expect("the server certificate");
        write("server.crt", signed.pem());
        write("server.key", server_key.serialize_pem());

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
