//! Certificates and keys for the loopback clusters: one CA per environment, a serving
//! certificate per apiserver, and a service-account signing key per cluster.

use std::fs;
use std::net::{IpAddr, Ipv4Addr};
use std::path::Path;

use anyhow::Result;
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair, KeyUsagePurpose,
    SanType,
};

/// The environment's certificate authority.
pub struct Ca {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

impl Ca {
    /// Creates a new CA.
    pub fn new() -> Result<Ca> {
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params
            .distinguished_name
            .push(DnType::CommonName, "tender-e2e-ca");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let issuer = CertifiedIssuer::self_signed(params, KeyPair::generate()?)?;
        Ok(Ca { issuer })
    }

    /// The CA certificate in PEM.
    pub fn cert_pem(&self) -> String {
        self.issuer.pem()
    }

    /// Writes `cert` and `key` PEM files for a loopback serving certificate.
    pub fn write_serving_cert(&self, cn: &str, cert: &Path, key: &Path) -> Result<()> {
        let (cert_pem, key_pem) = self.serving_cert_pem(cn)?;
        fs::write(cert, cert_pem)?;
        fs::write(key, key_pem)?;
        Ok(())
    }

    /// A loopback serving certificate (localhost, 127.0.0.1) and its key, in PEM.
    pub fn serving_cert_pem(&self, cn: &str) -> Result<(String, String)> {
        let mut params = CertificateParams::new(vec![
            "localhost".to_string(),
            "kubernetes".to_string(),
            "kubernetes.default".to_string(),
            "kubernetes.default.svc".to_string(),
        ])?;
        params
            .subject_alt_names
            .push(SanType::IpAddress(IpAddr::V4(Ipv4Addr::LOCALHOST)));
        params.distinguished_name.push(DnType::CommonName, cn);
        let key_pair = KeyPair::generate()?;
        let signed = params.signed_by(&key_pair, &self.issuer)?;
        Ok((signed.pem(), key_pair.serialize_pem()))
    }
}

/// Writes a service-account signing key pair (PKCS#8 private key, SPKI public key).
pub fn write_service_account_keys(private: &Path, public: &Path) -> Result<()> {
    let key = KeyPair::generate()?;
    fs::write(private, key.serialize_pem())?;
    fs::write(public, key.public_key_pem())?;
    Ok(())
}
