//! Certificates for a cluster, made with rcgen: a cluster CA, node certificates that name their
//! raft id (see `names`), and an optional HTTPS server certificate. `kv certs` writes them for a
//! cluster started by hand; `kv cluster` writes a throwaway set into its data dir.
//!
//! Files in the certificate dir: `ca.pem`, `ca.key`, `node-<id>.pem`, `node-<id>.key`, and
//! `http.pem`, `http.key` with `--http-san` (another name with `--http-name`). Keys are written with mode 0600. An existing CA is
//! reused (to add nodes); existing node files are kept.

use std::io::Write as _;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

use crate::tls::names::node_name;

/// A certificate and its key, PEM.
pub struct Pem {
    /// The certificate.
    pub cert_pem: String,
    /// Its private key.
    pub key_pem: String,
}

/// The cluster CA.
pub struct Ca {
    params: CertificateParams,
    key: KeyPair,
    /// The CA's certificate.
    pub cert_pem: String,
}

type CertResult<T> = Result<T, rcgen::Error>;

fn ca_params() -> CertificateParams {
    let mut p = CertificateParams::default();
    p.distinguished_name
        .push(DnType::CommonName, "raft-lease KV cluster CA");
    p.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    p.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    p
}

impl Ca {
    /// A new CA with a fresh key.
    pub fn generate() -> CertResult<Ca> {
        let key = KeyPair::generate()?;
        let params = ca_params();
        let cert_pem = params.self_signed(&key)?.pem();
        Ok(Ca {
            params,
            key,
            cert_pem,
        })
    }

    /// The CA whose certificate and key [`make`] wrote in `dir`.
    pub fn load(dir: &Path) -> Result<Ca, String> {
        let read = |f: &str| {
            std::fs::read_to_string(dir.join(f))
                .map_err(|e| format!("{}: {e}", dir.join(f).display()))
        };
        let key = KeyPair::from_pem(&read("ca.key")?).map_err(|e| format!("ca.key: {e}"))?;
        Ok(Ca {
            params: ca_params(), // the same subject, so certificates chain to the saved CA
            key,
            cert_pem: read("ca.pem")?,
        })
    }

    fn sign(&self, mut params: CertificateParams, cn: &str) -> CertResult<Pem> {
        params.distinguished_name.push(DnType::CommonName, cn);
        params.use_authority_key_identifier_extension = true;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, &Issuer::from_params(&self.params, &self.key))?;
        Ok(Pem {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }

    /// Node `id`'s certificate: its one SAN names the node; usable as TLS server and client.
    pub fn node_cert(&self, id: u64) -> CertResult<Pem> {
        let mut p = CertificateParams::new(vec![node_name(id)])?;
        p.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        self.sign(p, &format!("raft-lease node {id}"))
    }

    /// An HTTPS server certificate for these host names or IP addresses.
    pub fn server_cert(&self, sans: &[String]) -> CertResult<Pem> {
        let mut p = CertificateParams::new(sans.to_vec())?;
        p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        self.sign(p, "raft-lease KV HTTPS")
    }
}

/// Write `text` to a new file (`private`: mode 0600).
fn write_file(path: &Path, text: &str, private: bool) -> Result<(), String> {
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create(true).truncate(true);
    if private {
        opts.mode(0o600);
    }
    opts.open(path)
        .and_then(|mut f| f.write_all(text.as_bytes()).and_then(|_| f.sync_all()))
        .map_err(|e| format!("{}: {e}", path.display()))
}

/// The files of node `id` in a certificate dir.
pub fn node_files(dir: &Path, id: u64) -> (PathBuf, PathBuf) {
    (
        dir.join(format!("node-{id}.pem")),
        dir.join(format!("node-{id}.key")),
    )
}

/// Make (or reuse) the CA in `dir` and certificates for `ids`, and for `http_sans` an HTTPS
/// certificate in `<http_name>.pem` and `<http_name>.key`.
pub fn make(dir: &Path, ids: &[u64], http_sans: &[String], http_name: &str) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let ca = if dir.join("ca.key").exists() {
        Ca::load(dir)?
    } else {
        let ca = Ca::generate().map_err(|e| e.to_string())?;
        write_file(&dir.join("ca.key"), &ca.key.serialize_pem(), true)?;
        write_file(&dir.join("ca.pem"), &ca.cert_pem, false)?;
        ca
    };
    for &id in ids {
        let (cert, key) = node_files(dir, id);
        if cert.exists() && key.exists() {
            continue;
        }
        let pem = ca.node_cert(id).map_err(|e| e.to_string())?;
        write_file(&key, &pem.key_pem, true)?;
        write_file(&cert, &pem.cert_pem, false)?;
    }
    if !http_sans.is_empty() {
        let pem = ca.server_cert(http_sans).map_err(|e| e.to_string())?;
        write_file(&dir.join(format!("{http_name}.key")), &pem.key_pem, true)?;
        write_file(&dir.join(format!("{http_name}.pem")), &pem.cert_pem, false)?;
    }
    Ok(())
}
