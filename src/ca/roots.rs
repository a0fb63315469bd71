//! Where the CA's key and certificates come from, and where the root goes for clients.
//!
//! * Self-signed: `ca-cert.pem` + `ca-key.pem` in `--ca-dir`, generated (ECDSA P-256, 10 years,
//!   O=<trust domain>) on the first start and reused on every later one. A half-present pair is
//!   an error, never a reason to generate a new root.
//! * Plugged-in (`--cacerts DIR`, istiod's `cacerts` Secret): `ca-cert.pem`, `ca-key.pem`,
//!   `root-cert.pem`, `cert-chain.pem`, or `tls.crt`/`tls.key`/`ca.crt`. A partial set is an error
//!   naming the missing file. The signer must be a CA whose key matches and which chains to a
//!   root in the bundle.
//!
//! Either way the current root bundle is written to `<ca-dir>/root-cert.pem`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair, KeyUsagePurpose};
use rustls::pki_types::CertificateDer;
use time::OffsetDateTime;
use x509_parser::certificate::X509Certificate;

use crate::ca::keys::{certificates, load_private_key, random_serial};
use crate::ca::signer::Signer;

/// The self-signed CA's files in `--ca-dir`, and the published root everywhere.
pub const CA_CERT: &str = "ca-cert.pem";
pub const CA_KEY: &str = "ca-key.pem";
pub const ROOT_CERT: &str = "root-cert.pem";
pub const CERT_CHAIN: &str = "cert-chain.pem";
/// The Kubernetes `kubernetes.io/tls` layout of a plugged-in CA.
pub const TLS_CERT: &str = "tls.crt";
pub const TLS_KEY: &str = "tls.key";
pub const TLS_CA: &str = "ca.crt";

/// Lifetime of a generated self-signed root (istiod's default).
pub const SELF_SIGNED_TTL: Duration = Duration::from_secs(10 * 365 * 24 * 3600);

/// Why the CA material could not be loaded or stored.
#[derive(Debug, thiserror::Error)]
pub enum RootsError {
    #[error("{dir}: {missing} is missing (a plugged-in CA needs {set})")]
    Missing {
        dir: PathBuf,
        missing: &'static str,
        set: &'static str,
    },
    #[error(
        "{dir}: no CA files: expected ca-cert.pem, ca-key.pem, root-cert.pem and cert-chain.pem, or tls.crt, tls.key and ca.crt"
    )]
    Empty { dir: PathBuf },
    #[error(
        "{dir}: {present} exists but {missing} does not; refusing to generate a new root over half a CA (restore {missing}, or move {present} away to start a new CA)"
    )]
    HalfSelfSigned {
        dir: PathBuf,
        present: &'static str,
        missing: &'static str,
    },
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("writing {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: {reason}")]
    Invalid { path: PathBuf, reason: String },
    #[error("generating the self-signed root: {0}")]
    Generate(String),
}

/// CA material loaded from disk, with the bytes it came from (to notice real changes).
#[derive(Debug)]
pub struct Loaded {
    pub signer: Signer,
    /// The concatenated file contents; equal bytes mean an unchanged CA.
    pub fingerprint: Vec<u8>,
}

/// Loads the self-signed CA from `dir`, generating and persisting one if there is none.
pub fn load_or_create_self_signed(
    dir: &Path,
    trust_domain: &str,
    now: OffsetDateTime,
) -> Result<Loaded, RootsError> {
    let cert_path = dir.join(CA_CERT);
    let key_path = dir.join(CA_KEY);
    match (cert_path.exists(), key_path.exists()) {
        (true, true) => {}
        (false, false) => generate_self_signed(dir, trust_domain, now)?,
        (true, false) => {
            return Err(RootsError::HalfSelfSigned {
                dir: dir.into(),
                present: CA_CERT,
                missing: CA_KEY,
            });
        }
        (false, true) => {
            return Err(RootsError::HalfSelfSigned {
                dir: dir.into(),
                present: CA_KEY,
                missing: CA_CERT,
            });
        }
    }
    let cert_pem = read(&cert_path)?;
    let key_pem = read(&key_path)?;
    let cert = single_certificate(&cert_path, &cert_pem)?;
    let key = load_private_key(&key_pem).map_err(|reason| invalid(&key_path, reason))?;
    check_signer(&cert_path, &cert, &key, now)?;
    let signer = Signer::new(&cert, key, &[], vec![cert.clone()])
        .map_err(|reason| invalid(&cert_path, reason))?;
    Ok(Loaded {
        signer,
        fingerprint: [cert_pem, key_pem].concat(),
    })
}

fn generate_self_signed(
    dir: &Path,
    trust_domain: &str,
    now: OffsetDateTime,
) -> Result<(), RootsError> {
    let generated = self_signed_pem(trust_domain, now)?;
    std::fs::create_dir_all(dir).map_err(|source| RootsError::Write {
        path: dir.into(),
        source,
    })?;
    // The key first: a crash in between leaves "key without cert", which the next start
    // reports instead of silently making a second root.
    write_atomic(&dir.join(CA_KEY), generated.key_pem.as_bytes(), true)?;
    write_atomic(&dir.join(CA_CERT), generated.cert_pem.as_bytes(), false)?;
    tracing::info!(dir = %dir.display(), "generated a self-signed root CA (ECDSA P-256)");
    Ok(())
}

/// A generated self-signed root, as PEM.
#[derive(Clone)]
pub struct SelfSigned {
    pub cert_pem: String,
    pub key_pem: String,
}

impl std::fmt::Debug for SelfSigned {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SelfSigned").finish_non_exhaustive()
    }
}

/// Generates a self-signed root (ECDSA P-256, 10 years, O=<trust domain>) in memory: for the
/// `istio-ca-secret` Secret in a cluster, or `--ca-dir` locally.
pub fn self_signed_pem(trust_domain: &str, now: OffsetDateTime) -> Result<SelfSigned, RootsError> {
    let key = KeyPair::generate().map_err(|e| RootsError::Generate(e.to_string()))?;
    let mut params = CertificateParams::default();
    params.distinguished_name = rcgen::DistinguishedName::new();
    params
        .distinguished_name
        .push(DnType::OrganizationName, trust_domain);
    params.not_before = now - Duration::from_secs(120);
    params.not_after = now + SELF_SIGNED_TTL;
    params.serial_number = Some(random_serial());
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let cert = params
        .self_signed(&key)
        .map_err(|e| RootsError::Generate(e.to_string()))?;
    Ok(SelfSigned {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    })
}

/// Loads a plugged-in CA from `dir` (istiod's `cacerts` layout or `kubernetes.io/tls`).
pub fn load_plugged_in(dir: &Path, now: OffsetDateTime) -> Result<Loaded, RootsError> {
    const ISTIO: [&str; 4] = [CA_CERT, CA_KEY, ROOT_CERT, CERT_CHAIN];
    const TLS: [&str; 3] = [TLS_CERT, TLS_KEY, TLS_CA];
    let has = |name: &str| dir.join(name).exists();
    let (cert_name, key_name, root_name, chain_name) = if ISTIO.iter().any(|n| has(n)) {
        if let Some(missing) = ISTIO.iter().find(|n| !has(n)) {
            return Err(RootsError::Missing {
                dir: dir.into(),
                missing,
                set: "ca-cert.pem, ca-key.pem, root-cert.pem and cert-chain.pem",
            });
        }
        (CA_CERT, CA_KEY, ROOT_CERT, Some(CERT_CHAIN))
    } else if TLS.iter().any(|n| has(n)) {
        if let Some(missing) = TLS.iter().find(|n| !has(n)) {
            return Err(RootsError::Missing {
                dir: dir.into(),
                missing,
                set: "tls.crt, tls.key and ca.crt",
            });
        }
        (TLS_CERT, TLS_KEY, TLS_CA, None)
    } else {
        return Err(RootsError::Empty { dir: dir.into() });
    };

    let cert_path = dir.join(cert_name);
    let key_path = dir.join(key_name);
    let root_path = dir.join(root_name);
    let cert_pem = read(&cert_path)?;
    let key_pem = read(&key_path)?;
    let root_pem = read(&root_path)?;
    let chain_pem = match chain_name {
        Some(name) => read(&dir.join(name))?,
        None => Vec::new(),
    };
    let mut cert_file = certificates(&cert_pem).map_err(|reason| invalid(&cert_path, reason))?;
    if cert_file.is_empty() {
        return Err(invalid(&cert_path, "no CERTIFICATE block".into()));
    }
    let signer_cert = cert_file.remove(0);
    let key = load_private_key(&key_pem).map_err(|reason| invalid(&key_path, reason))?;
    let roots = certificates(&root_pem).map_err(|reason| invalid(&root_path, reason))?;
    if roots.is_empty() {
        return Err(invalid(&root_path, "no CERTIFICATE block".into()));
    }
    // tls.crt may carry its own chain after the signer; cert-chain.pem carries it otherwise.
    let mut chain = cert_file;
    if let Some(name) = chain_name {
        let path = dir.join(name);
        chain.extend(certificates(&chain_pem).map_err(|reason| invalid(&path, reason))?);
    }
    check_signer(&cert_path, &signer_cert, &key, now)?;
    check_chains_to_root(&cert_path, &signer_cert, &chain, &roots)?;

    // Intermediates sent after the leaf: the signer (unless it is a root), then the rest of the
    // chain, without duplicates and without roots (the bundle is the last element).
    let mut intermediates: Vec<CertificateDer<'static>> = Vec::new();
    for cert in std::iter::once(&signer_cert).chain(chain.iter()) {
        if !roots.contains(cert) && !intermediates.contains(cert) {
            intermediates.push(cert.clone());
        }
    }
    let signer = Signer::new(&signer_cert, key, &intermediates, roots)
        .map_err(|reason| invalid(&cert_path, reason))?;
    Ok(Loaded {
        signer,
        fingerprint: [cert_pem, key_pem, root_pem, chain_pem].concat(),
    })
}

/// Writes the root bundle to `<dir>/root-cert.pem` if it differs from what is there.
pub fn publish_root(dir: &Path, bundle: &str) -> Result<PathBuf, RootsError> {
    let path = dir.join(ROOT_CERT);
    if std::fs::read(&path).is_ok_and(|current| current == bundle.as_bytes()) {
        return Ok(path);
    }
    std::fs::create_dir_all(dir).map_err(|source| RootsError::Write {
        path: dir.into(),
        source,
    })?;
    write_atomic(&path, bundle.as_bytes(), false)?;
    Ok(path)
}

/// Writes `bytes` to a temporary file beside `path`, then renames it into place.
pub fn write_atomic(path: &Path, bytes: &[u8], secret: bool) -> Result<(), RootsError> {
    let write_error = |source| RootsError::Write {
        path: path.into(),
        source,
    };
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = path.with_file_name(format!(".{name}.tmp-{}", std::process::id()));
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    if secret {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    #[cfg(not(unix))]
    let _ = secret;
    let mut file = options.open(&tmp).map_err(write_error)?;
    std::io::Write::write_all(&mut file, bytes).map_err(write_error)?;
    file.sync_all().map_err(write_error)?;
    drop(file);
    std::fs::rename(&tmp, path).map_err(write_error)
}

fn read(path: &Path) -> Result<Vec<u8>, RootsError> {
    std::fs::read(path).map_err(|source| RootsError::Read {
        path: path.into(),
        source,
    })
}

fn invalid(path: &Path, reason: String) -> RootsError {
    RootsError::Invalid {
        path: path.into(),
        reason,
    }
}

fn single_certificate(path: &Path, pem: &[u8]) -> Result<CertificateDer<'static>, RootsError> {
    certificates(pem)
        .map_err(|reason| invalid(path, reason))?
        .into_iter()
        .next()
        .ok_or_else(|| invalid(path, "no CERTIFICATE block".into()))
}

fn parse<'a>(path: &Path, der: &'a [u8]) -> Result<X509Certificate<'a>, RootsError> {
    x509_parser::parse_x509_certificate(der)
        .map(|(_, cert)| cert)
        .map_err(|e| invalid(path, format!("certificate does not parse: {e}")))
}

/// The signing certificate is a CA, is valid now, and belongs to `key`.
fn check_signer(
    path: &Path,
    der: &CertificateDer<'_>,
    key: &KeyPair,
    now: OffsetDateTime,
) -> Result<(), RootsError> {
    let cert = parse(path, der)?;
    if !cert.is_ca() {
        return Err(invalid(
            path,
            "the signing certificate is not a CA (basicConstraints CA:TRUE)".into(),
        ));
    }
    if let Ok(Some(usage)) = cert.key_usage()
        && !usage.value.key_cert_sign()
    {
        return Err(invalid(
            path,
            "the signing certificate's key usage lacks keyCertSign".into(),
        ));
    }
    let not_after = cert.validity().not_after.to_datetime();
    if not_after <= now {
        return Err(invalid(
            path,
            format!("the signing certificate expired at {not_after}"),
        ));
    }
    if cert.public_key().subject_public_key.data.as_ref() != key.public_key_raw() {
        return Err(invalid(
            path,
            "the private key does not match the certificate".into(),
        ));
    }
    Ok(())
}

/// `signer` is a root, or its signature chain through `chain` ends at one of `roots`.
fn check_chains_to_root(
    path: &Path,
    signer: &CertificateDer<'_>,
    chain: &[CertificateDer<'_>],
    roots: &[CertificateDer<'_>],
) -> Result<(), RootsError> {
    let mut current = signer.clone();
    for _ in 0..8 {
        if roots.contains(&current) {
            return Ok(());
        }
        let cert = parse(path, &current)?;
        let issuer = chain.iter().chain(roots.iter()).find(|candidate| {
            **candidate != current
                && x509_parser::parse_x509_certificate(candidate).is_ok_and(|(_, c)| {
                    c.subject() == cert.issuer()
                        && cert.verify_signature(Some(c.public_key())).is_ok()
                })
        });
        match issuer {
            Some(issuer) if roots.contains(issuer) => return Ok(()),
            Some(issuer) => current = issuer.clone(),
            None => break,
        }
    }
    Err(invalid(
        path,
        "the signing certificate does not chain to a root in the root bundle".into(),
    ))
}
