//! The signer: a CSR and an authorized identity in, a certificate chain out. Time is passed in.
//!
//! Only the CSR's public key (and common name, if any) is used: the SAN is always the identity
//! the authorizer chose, whatever the CSR asks for. The leaf has KeyUsage
//! DigitalSignature|KeyEncipherment, EKU server+client auth, `CA:FALSE`, NotBefore two minutes
//! back, and NotAfter clamped to the signing certificate's. The chain is
//! `[leaf, intermediates…, root bundle]`, each element PEM ending in `\n`, as istiod sends it.

use std::time::Duration;

use rcgen::{
    CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType, SubjectPublicKeyInfo,
};
use rustls::pki_types::CertificateDer;
use time::OffsetDateTime;
use x509_parser::certification_request::X509CertificationRequest;
use x509_parser::prelude::FromDer;

use crate::ca::identity::SpiffeId;
use crate::ca::keys::{certificate_pem, random_serial};

/// How far back NotBefore goes, for clock skew between nodes (istiod's value).
pub const BACKDATE: Duration = Duration::from_secs(120);

/// Why a certificate was not signed.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SignError {
    /// The CSR is not PEM, does not parse, or its signature does not verify.
    #[error("invalid CSR: {0}")]
    BadCsr(String),
    /// The requested lifetime is over the maximum.
    #[error("requested TTL {requested}s is greater than the max allowed TTL {max}s")]
    TtlTooLong { requested: i64, max: u64 },
    /// The CA cannot sign now (expired signer, encoding failure).
    #[error("the CA cannot sign: {0}")]
    Internal(String),
}

impl SignError {
    /// istiod's error type, the `error` label of `citadel_server_csr_sign_err_count`.
    pub fn error_type(&self) -> &'static str {
        match self {
            SignError::BadCsr(_) => "CSR_ERROR",
            SignError::TtlTooLong { .. } => "TTL_ERROR",
            SignError::Internal(_) => "CERT_GEN_ERROR",
        }
    }
}

/// Certificate lifetimes: what an unspecified request gets, and the most it may ask for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TtlPolicy {
    pub default: Duration,
    pub max: Duration,
}

impl Default for TtlPolicy {
    fn default() -> Self {
        TtlPolicy {
            default: Duration::from_secs(24 * 3600),
            max: Duration::from_secs(90 * 24 * 3600),
        }
    }
}

impl TtlPolicy {
    /// The lifetime for a request's `validity_duration` (seconds): `<= 0` means the default;
    /// over the maximum is an error, as in istiod.
    pub fn resolve(&self, requested: i64) -> Result<Duration, SignError> {
        if requested <= 0 {
            return Ok(self.default);
        }
        if requested as u64 > self.max.as_secs() {
            return Err(SignError::TtlTooLong {
                requested,
                max: self.max.as_secs(),
            });
        }
        Ok(Duration::from_secs(requested as u64))
    }
}

/// The public key (and common name, if any) of a CSR whose signature verified.
#[derive(Debug)]
pub struct Csr {
    pub public_key: SubjectPublicKeyInfo,
    pub common_name: Option<String>,
}

impl Csr {
    /// Parses a PEM `CERTIFICATE REQUEST` and checks its self-signature.
    pub fn parse_pem(pem: &str) -> Result<Csr, SignError> {
        let block = pem::parse(pem.trim_start())
            .map_err(|e| SignError::BadCsr(format!("not a PEM block: {e}")))?;
        if !matches!(
            block.tag(),
            "CERTIFICATE REQUEST" | "NEW CERTIFICATE REQUEST"
        ) {
            return Err(SignError::BadCsr(format!(
                "PEM block is {:?}, not CERTIFICATE REQUEST",
                block.tag()
            )));
        }
        Csr::parse_der(block.contents())
    }

    /// Parses a DER CSR and checks its self-signature.
    pub fn parse_der(der: &[u8]) -> Result<Csr, SignError> {
        let (rest, csr) = X509CertificationRequest::from_der(der)
            .map_err(|e| SignError::BadCsr(format!("does not parse: {e}")))?;
        if !rest.is_empty() {
            return Err(SignError::BadCsr("trailing bytes after the CSR".into()));
        }
        csr.verify_signature()
            .map_err(|e| SignError::BadCsr(format!("signature does not verify: {e}")))?;
        let info = &csr.certification_request_info;
        let public_key = SubjectPublicKeyInfo::from_der(info.subject_pki.raw)
            .map_err(|e| SignError::BadCsr(format!("unsupported public key: {e}")))?;
        let common_name = info
            .subject
            .iter_common_name()
            .next()
            .and_then(|cn| cn.as_str().ok())
            .map(str::to_string);
        Ok(Csr {
            public_key,
            common_name,
        })
    }
}

/// A CA that can sign: its key and certificate, and what goes after the leaf in a chain.
pub struct Signer {
    issuer: Issuer<'static, KeyPair>,
    not_after: OffsetDateTime,
    /// The first root's NotAfter (istiod's root expiry: the first certificate of the bundle).
    root_not_after: OffsetDateTime,
    /// PEM, signer first, excluding roots; each ends in `\n`.
    intermediates: Vec<String>,
    /// Every root, concatenated: the last element of every chain.
    root_bundle: String,
    roots: Vec<CertificateDer<'static>>,
}

impl std::fmt::Debug for Signer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Signer")
            .field("not_after", &self.not_after)
            .field("intermediates", &self.intermediates.len())
            .field("roots", &self.roots.len())
            .finish_non_exhaustive()
    }
}

impl Signer {
    /// A signer for `signer_cert` with `key`. `intermediates` are the certificates between the
    /// leaf and the roots (the signer first, unless the signer is itself a root).
    pub fn new(
        signer_cert: &CertificateDer<'_>,
        key: KeyPair,
        intermediates: &[CertificateDer<'_>],
        roots: Vec<CertificateDer<'static>>,
    ) -> Result<Signer, String> {
        let (_, parsed) = x509_parser::parse_x509_certificate(signer_cert)
            .map_err(|e| format!("signing certificate does not parse: {e}"))?;
        let not_after = parsed.validity().not_after.to_datetime();
        let issuer = Issuer::from_ca_cert_der(signer_cert, key)
            .map_err(|e| format!("signing certificate is not usable: {e}"))?;
        let Some(first_root) = roots.first() else {
            return Err("no root certificate".into());
        };
        let (_, parsed_root) = x509_parser::parse_x509_certificate(first_root)
            .map_err(|e| format!("root certificate does not parse: {e}"))?;
        let root_not_after = parsed_root.validity().not_after.to_datetime();
        let root_bundle = roots.iter().map(|r| certificate_pem(r)).collect();
        Ok(Signer {
            issuer,
            not_after,
            root_not_after,
            intermediates: intermediates.iter().map(|c| certificate_pem(c)).collect(),
            root_bundle,
            roots,
        })
    }

    /// The roots clients should trust, as one PEM bundle.
    pub fn root_bundle(&self) -> &str {
        &self.root_bundle
    }

    pub fn roots(&self) -> &[CertificateDer<'static>] {
        &self.roots
    }

    /// The signing certificate's NotAfter.
    pub fn not_after(&self) -> OffsetDateTime {
        self.not_after
    }

    /// The root's NotAfter: the first certificate of the root bundle, as istiod reads it for
    /// `citadel_server_root_cert_expiry_timestamp`.
    pub fn root_not_after(&self) -> OffsetDateTime {
        self.root_not_after
    }

    /// Signs a workload certificate for `identity` and returns the chain
    /// `[leaf, intermediates…, root bundle]`.
    pub fn sign_workload(
        &self,
        csr: &Csr,
        identity: &SpiffeId,
        ttl: Duration,
        now: OffsetDateTime,
    ) -> Result<Vec<String>, SignError> {
        let uri = rcgen::string::Ia5String::try_from(identity.to_string())
            .map_err(|e| SignError::Internal(format!("identity is not IA5: {e}")))?;
        let mut subject = DistinguishedName::new();
        if let Some(cn) = &csr.common_name {
            subject.push(DnType::CommonName, cn.as_str());
        }
        let leaf = self.leaf(&csr.public_key, subject, vec![SanType::URI(uri)], ttl, now)?;
        let mut chain = Vec::with_capacity(self.intermediates.len() + 2);
        chain.push(certificate_pem(&leaf));
        chain.extend(self.intermediates.iter().cloned());
        chain.push(self.root_bundle.clone());
        Ok(chain)
    }

    /// Signs a TLS server certificate for `key` with `sans`; returns `[leaf, intermediates…]`
    /// as DER, ready for rustls.
    pub fn sign_server(
        &self,
        key: &KeyPair,
        sans: Vec<SanType>,
        ttl: Duration,
        now: OffsetDateTime,
    ) -> Result<Vec<CertificateDer<'static>>, SignError> {
        let leaf = self.leaf(key, DistinguishedName::new(), sans, ttl, now)?;
        let mut chain = vec![leaf];
        for pem in &self.intermediates {
            chain.extend(
                crate::ca::keys::certificates(pem.as_bytes()).map_err(SignError::Internal)?,
            );
        }
        Ok(chain)
    }

    fn leaf(
        &self,
        public_key: &impl rcgen::PublicKeyData,
        subject: DistinguishedName,
        sans: Vec<SanType>,
        ttl: Duration,
        now: OffsetDateTime,
    ) -> Result<CertificateDer<'static>, SignError> {
        if self.not_after <= now {
            return Err(SignError::Internal(format!(
                "the signing certificate expired at {}",
                self.not_after
            )));
        }
        let mut params = CertificateParams::default();
        params.distinguished_name = subject;
        params.not_before = now - BACKDATE;
        params.not_after = (now + ttl).min(self.not_after);
        params.serial_number = Some(random_serial());
        params.subject_alt_names = sans;
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        params.use_authority_key_identifier_extension = true;
        let cert = params
            .signed_by(public_key, &self.issuer)
            .map_err(|e| SignError::Internal(format!("signing failed: {e}")))?;
        Ok(cert.der().clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttl_policy_matches_istiod() {
        let policy = TtlPolicy::default();
        assert_eq!(policy.resolve(0), Ok(Duration::from_secs(86400)));
        assert_eq!(policy.resolve(-5), Ok(Duration::from_secs(86400)));
        assert_eq!(policy.resolve(3600), Ok(Duration::from_secs(3600)));
        assert_eq!(
            policy.resolve(90 * 86400),
            Ok(Duration::from_secs(90 * 86400))
        );
        assert!(matches!(
            policy.resolve(90 * 86400 + 1),
            Err(SignError::TtlTooLong { .. })
        ));
    }

    #[test]
    fn bad_csrs_are_named() {
        for (csr, want) in [
            ("", "not a PEM block"),
            (
                "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
                "not CERTIFICATE REQUEST",
            ),
            (
                "-----BEGIN CERTIFICATE REQUEST-----\nAAAA\n-----END CERTIFICATE REQUEST-----\n",
                "does not parse",
            ),
        ] {
            let error = Csr::parse_pem(csr).unwrap_err().to_string();
            assert!(error.contains(want), "{error}");
        }
    }
}
