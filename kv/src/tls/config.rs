//! TLS for peers (mutual, with the cluster CA) and for HTTP clients (server only), on rustls.
//!
//! A node's identity is its certificate's one subject alternative name, the DNS name
//! `node-<id>.raft-lease`: exactly one SAN, of that form, decimal with no sign or leading zero, a
//! nonzero u64. Anything else is not a node certificate. A client connecting to peer N asks for
//! server name `node-N.raft-lease`, so rustls checks the chain and the name; the listener reads the
//! client certificate's id and drops any message whose `from` differs.

use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use thiserror::Error;
use tokio_rustls::{TlsAcceptor, TlsConnector};
use x509_parser::extensions::GeneralName;

use crate::tls::names::{node_name, parse_node_name};

/// Why TLS could not be set up, or a certificate names no node.
#[derive(Debug, Error)]
pub enum TlsError {
    /// A file that cannot be read or parsed.
    #[error("{path}: {why}")]
    File {
        /// The file.
        path: String,
        /// Why.
        why: String,
    },
    /// A certificate whose SAN is not one node name.
    #[error("not a node certificate: {0}")]
    NotANode(String),
    /// This node's certificate names another node.
    #[error("certificate {path} names node {found}, but this is node {expected}")]
    WrongNode {
        /// The certificate file.
        path: String,
        /// The node it names.
        found: u64,
        /// This node.
        expected: u64,
    },
    /// rustls refused the configuration.
    #[error("TLS configuration: {0}")]
    Config(#[from] rustls::Error),
    /// rustls refused the client verifier.
    #[error("client verifier: {0}")]
    Verifier(#[from] rustls::server::VerifierBuilderError),
}

/// The node id a DER certificate names: its only SAN must be a node name.
pub fn cert_node_id(der: &[u8]) -> Result<u64, TlsError> {
    let (_, cert) = x509_parser::parse_x509_certificate(der)
        .map_err(|e| TlsError::NotANode(format!("unparsable: {e}")))?;
    let san = cert
        .subject_alternative_name()
        .map_err(|e| TlsError::NotANode(format!("bad SAN extension: {e}")))?
        .ok_or_else(|| TlsError::NotANode("no SAN".into()))?;
    match san.value.general_names.as_slice() {
        [GeneralName::DNSName(n)] => {
            parse_node_name(n).ok_or_else(|| TlsError::NotANode(format!("SAN {n:?}")))
        }
        names => Err(TlsError::NotANode(format!(
            "{} SANs, expected one DNS name",
            names.len()
        ))),
    }
}

fn file_err(path: &Path, why: impl ToString) -> TlsError {
    TlsError::File {
        path: path.display().to_string(),
        why: why.to_string(),
    }
}

fn load_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| file_err(path, e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| file_err(path, e))?;
    if certs.is_empty() {
        return Err(file_err(path, "no certificate in it"));
    }
    Ok(certs)
}

fn load_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_file(path).map_err(|e| file_err(path, e))
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Mutual TLS for the peer port: both ends present node certificates signed by the cluster CA.
#[derive(Clone)]
pub struct PeerTls {
    /// For the peer listener (asks for a client certificate).
    pub acceptor: TlsAcceptor,
    /// For connecting to peers (presents this node's certificate).
    pub connector: TlsConnector,
}

impl PeerTls {
    /// Load the CA and this node's certificate and key; the certificate must name `my_id`.
    pub fn load(ca: &Path, cert: &Path, key: &Path, my_id: u64) -> Result<PeerTls, TlsError> {
        let mut roots = RootCertStore::empty();
        for c in load_certs(ca)? {
            roots.add(c).map_err(|e| file_err(ca, e))?;
        }
        let roots = Arc::new(roots);
        let chain = load_certs(cert)?;
        let found = cert_node_id(&chain[0])?;
        if found != my_id {
            return Err(TlsError::WrongNode {
                path: cert.display().to_string(),
                found,
                expected: my_id,
            });
        }
        let key = load_key(key)?;
        let verifier =
            WebPkiClientVerifier::builder_with_provider(roots.clone(), provider()).build()?;
        let server = ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()?
            .with_client_cert_verifier(verifier)
            .with_single_cert(chain.clone(), key.clone_key())?;
        let client = ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots)
            .with_client_auth_cert(chain, key)?;
        Ok(PeerTls {
            acceptor: TlsAcceptor::from(Arc::new(server)),
            connector: TlsConnector::from(Arc::new(client)),
        })
    }

    /// The server name to ask for when connecting to peer `id`.
    pub fn server_name(id: u64) -> ServerName<'static> {
        ServerName::try_from(node_name(id)).expect("node names are DNS names")
    }
}

/// The node id of the certificate a TLS peer presented, if any.
pub fn peer_node_id(conn: &rustls::CommonState) -> Option<u64> {
    let cert = conn.peer_certificates()?.first()?;
    cert_node_id(cert).ok()
}

/// HTTPS for clients: a server certificate and key, no client authentication.
pub fn http_acceptor(cert: &Path, key: &Path) -> Result<TlsAcceptor, TlsError> {
    let config = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(load_certs(cert)?, load_key(key)?)?;
    Ok(TlsAcceptor::from(Arc::new(config)))
}

/// TLS for the etcd API's port, from PEM bytes: a server certificate and key, no client
/// authentication, ALPN `h2` (gRPC, HTTP/2) and `http/1.1` (etcd's HTTP side).
pub fn client_port_acceptor(cert_pem: &[u8], key_pem: &[u8]) -> Result<TlsAcceptor, TlsError> {
    let bad = |what: &str, e: rustls::pki_types::pem::Error| TlsError::File {
        path: what.into(),
        why: e.to_string(),
    };
    let certs = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| bad("the etcd API's certificate", e))?;
    let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(|e| bad("the etcd API's key", e))?;
    let mut config = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(certs, key)?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}

/// A client of the nodes' HTTPS that trusts the CA certificates in the PEM file `ca`.
pub fn https_client(ca: &Path) -> Result<Arc<ClientConfig>, TlsError> {
    let mut roots = RootCertStore::empty();
    for c in load_certs(ca)? {
        roots.add(c).map_err(|e| file_err(ca, e))?;
    }
    let config = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(config))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_certificate_names_a_node_only_with_exactly_one_node_san() {
        let ca = crate::tls::certs::Ca::generate().unwrap();
        let node = ca.node_cert(3).unwrap();
        let der = CertificateDer::from_pem_slice(node.cert_pem.as_bytes()).unwrap();
        assert_eq!(cert_node_id(&der).unwrap(), 3);
        let http = ca.server_cert(&["localhost".into()]).unwrap();
        let der = CertificateDer::from_pem_slice(http.cert_pem.as_bytes()).unwrap();
        assert!(matches!(cert_node_id(&der), Err(TlsError::NotANode(_))));
        assert!(cert_node_id(b"junk").is_err());
    }
}
