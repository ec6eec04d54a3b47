//! TLS to chart sources (decision 0106-chart-repository-tls): the system roots, plus the
//! private CAs of a deployment's `helmSecretName` Secret (`cacerts`, as Fleet), or no
//! certificate verification at all with `helm.insecureSkipTLSVerify` (handshake signatures
//! are still checked, so the server holds the key of the certificate it sent).

use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};
use sha2::{Digest, Sha256};
use tender_types::conditions::reason;

use crate::Failure;

/// How one chart source's certificate is checked.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Trust {
    /// CAs trusted besides the system roots (DER).
    extra: Vec<CertificateDer<'static>>,
    /// Accept any certificate.
    insecure: bool,
}

impl Trust {
    /// The trust of a deployment: `cacerts` (PEM, one or more certificates) if its
    /// helmSecretName Secret has the key, and `helm.insecureSkipTLSVerify`.
    pub fn new(cacerts: Option<&[u8]>, insecure: bool) -> Result<Self, Failure> {
        let extra = match cacerts {
            Some(pem) => parse_cas(pem)?,
            None => Vec::new(),
        };
        Ok(Self { extra, insecure })
    }

    /// Whether this is the agent's default (system roots only).
    pub fn is_system(&self) -> bool {
        self.extra.is_empty() && !self.insecure
    }

    /// A key naming this trust (for the client cache and the render memo).
    pub fn key(&self) -> String {
        let mut h = Sha256::new();
        h.update([u8::from(self.insecure)]);
        for c in &self.extra {
            h.update((c.len() as u64).to_be_bytes());
            h.update(c.as_ref());
        }
        hex::encode(h.finalize())
    }

    /// The client configuration: `system` roots plus the extra CAs, or no verification.
    pub fn client_config(&self, system: &RootCertStore) -> ClientConfig {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .expect("ring supports the default protocol versions");
        if self.insecure {
            return builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(AnyCertificate(provider)))
                .with_no_client_auth();
        }
        let mut roots = system.clone();
        for c in &self.extra {
            // Checked by `parse_cas`.
            let _ = roots.add(c.clone());
        }
        builder.with_root_certificates(roots).with_no_client_auth()
    }
}

/// The system's roots.
pub fn system_roots() -> RootCertStore {
    let mut roots = RootCertStore::empty();
    for cert in rustls_native_certs::load_native_certs().certs {
        let _ = roots.add(cert);
    }
    roots
}

/// The certificates of a `cacerts` value: at least one, each usable as a trust anchor.
fn parse_cas(pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, Failure> {
    let invalid = |why: &str| {
        Failure::new(
            reason::CHART_REPOSITORY_CA_INVALID,
            format!(
                "key cacerts of the helmSecretName Secret {why}: it must hold one or more PEM \
                 certificates (-----BEGIN CERTIFICATE-----)"
            ),
        )
    };
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<_, _>>()
        .map_err(|_| invalid("is not valid PEM"))?;
    if certs.is_empty() {
        return Err(invalid("has no certificate"));
    }
    let mut check = RootCertStore::empty();
    for (i, c) in certs.iter().enumerate() {
        check
            .add(c.clone())
            .map_err(|_| invalid(&format!("has an unreadable certificate (number {})", i + 1)))?;
    }
    Ok(certs)
}

/// Accepts any server certificate; handshake signatures are still verified with the
/// provider's algorithms (rustls' `dangerous()` API).
#[derive(Debug)]
struct AnyCertificate(Arc<CryptoProvider>);

impl ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ca_pem() -> String {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params.self_signed(&key).unwrap().pem()
    }

    #[test]
    fn cacerts_hold_one_or_more_pem_certificates() {
        let two = format!("{}\n{}", ca_pem(), ca_pem());
        let t = Trust::new(Some(two.as_bytes()), false).unwrap();
        assert_eq!(t.extra.len(), 2);
        assert!(!t.is_system());
        assert_ne!(t.key(), Trust::default().key());
        assert_ne!(
            Trust::new(None, true).unwrap().key(),
            Trust::default().key()
        );
        assert!(Trust::default().is_system());
        for bad in [
            "",
            "not a certificate",
            "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
            "-----BEGIN CERTIFICATE-----\n!!!\n-----END CERTIFICATE-----\n",
        ] {
            let e = Trust::new(Some(bad.as_bytes()), false).unwrap_err();
            assert_eq!(e.reason, reason::CHART_REPOSITORY_CA_INVALID, "{bad:?}");
        }
        // Configurations build for each kind.
        let roots = RootCertStore::empty();
        let _ = t.client_config(&roots);
        let _ = Trust::new(None, true).unwrap().client_config(&roots);
    }
}
