//! The signer and the roots, without a network: ztunnel-shaped CSRs signed and verified with
//! webpki, restarts keeping the root, and plugged-in CAs signing under their chain.

use crate::support::ca as ca_support;

use std::time::Duration;

use ambientd::ca::SpiffeId;
use ambientd::ca::keys::{certificates, pem_encode};
use ambientd::ca::roots::{self, RootsError};
use ambientd::ca::signer::{Csr, SignError};
use ca_support::*;
use rcgen::KeyPair;
use time::OffsetDateTime;

const WEB: &str = "spiffe://cluster.local/ns/demo/sa/web";

fn web() -> SpiffeId {
    SpiffeId::parse(WEB).unwrap()
}

#[test]
fn signs_a_ztunnel_csr_and_the_chain_verifies() {
    let dir = tempfile::tempdir().unwrap();
    let now = OffsetDateTime::now_utc();
    let loaded = roots::load_or_create_self_signed(dir.path(), "cluster.local", now).unwrap();
    // The CSR asks for another identity: the signer ignores it.
    let (_key, csr) = ztunnel_csr("spiffe://cluster.local/ns/evil/sa/admin");
    let csr = Csr::parse_pem(&csr).unwrap();
    let ttl = Duration::from_secs(3600);
    let chain = loaded.signer.sign_workload(&csr, &web(), ttl, now).unwrap();

    assert_eq!(chain.len(), 2, "self-signed: [leaf, root]");
    assert_eq!(chain[1], loaded.signer.root_bundle());
    let leaf = verify_chain(&chain);
    assert_eq!(leaf.uris, vec![WEB.to_string()]);
    assert!(leaf.san_critical, "empty subject => critical SAN");
    assert!(leaf.subject_empty);
    assert!(leaf.digital_signature && leaf.key_encipherment);
    assert!(leaf.server_auth && leaf.client_auth);
    assert!(!leaf.is_ca);
    assert_eq!(leaf.not_before, now.unix_timestamp() - 120);
    assert_eq!(leaf.not_after, now.unix_timestamp() + 3600);
}

#[test]
fn a_csr_with_a_bad_signature_is_refused_clearly() {
    let (_key, csr) = ztunnel_csr(WEB);
    let mut der = certificates(csr.as_bytes()).unwrap_or_default();
    assert!(der.is_empty(), "a CSR is not a CERTIFICATE block");
    let block = ambientd::ca::keys::pem_blocks(csr.as_bytes())
        .unwrap()
        .remove(0);
    let mut bytes = block.der.clone();
    let last = bytes.len() - 1;
    bytes[last] ^= 0x01; // inside the signature
    let tampered = pem_encode("CERTIFICATE REQUEST", &bytes);
    let error = Csr::parse_pem(&tampered).unwrap_err();
    assert!(matches!(error, SignError::BadCsr(_)), "{error}");
    assert!(error.to_string().contains("signature"), "{error}");
    der.clear();
}

#[test]
fn restart_keeps_the_same_root() {
    let dir = tempfile::tempdir().unwrap();
    let now = OffsetDateTime::now_utc();
    let first = roots::load_or_create_self_signed(dir.path(), "cluster.local", now).unwrap();
    let second = roots::load_or_create_self_signed(dir.path(), "cluster.local", now).unwrap();
    assert_eq!(first.signer.root_bundle(), second.signer.root_bundle());
    assert_eq!(first.fingerprint, second.fingerprint);

    // A certificate from before the restart verifies under the root after it.
    let (_key, csr) = ztunnel_csr(WEB);
    let chain = first
        .signer
        .sign_workload(
            &Csr::parse_pem(&csr).unwrap(),
            &web(),
            Duration::from_secs(60),
            now,
        )
        .unwrap();
    let mut after = chain.clone();
    *after.last_mut().unwrap() = second.signer.root_bundle().to_string();
    verify_chain(&after);

    // Half a CA is an error that names the missing file, never a new root.
    std::fs::remove_file(dir.path().join("ca-key.pem")).unwrap();
    let error = roots::load_or_create_self_signed(dir.path(), "cluster.local", now).unwrap_err();
    assert!(
        matches!(error, RootsError::HalfSelfSigned { .. }),
        "{error}"
    );
    assert!(error.to_string().contains("ca-key.pem"), "{error}");
    assert!(!dir.path().join("ca-key.pem").exists());
}

#[test]
fn a_plugged_in_ca_signs_under_its_chain() {
    let ca = plugged_ca(Duration::from_secs(365 * 86400));
    let dir = tempfile::tempdir().unwrap();
    // istio's layout; cert-chain.pem holds the signing cert, then the root.
    ca.write_cacerts(dir.path());
    let now = OffsetDateTime::now_utc();
    let loaded = roots::load_plugged_in(dir.path(), now).unwrap();
    assert_eq!(loaded.signer.root_bundle(), ca.root_pem);
    // The root's expiry (ten years) is its own, not the intermediate's (one year).
    let year = Duration::from_secs(365 * 86400);
    assert!(loaded.signer.not_after() <= now + year + Duration::from_secs(86400));
    assert!(loaded.signer.root_not_after() > now + 9 * year);
    let (_key, csr) = ztunnel_csr(WEB);
    let chain = loaded
        .signer
        .sign_workload(
            &Csr::parse_pem(&csr).unwrap(),
            &web(),
            Duration::from_secs(3600),
            now,
        )
        .unwrap();
    assert_eq!(chain.len(), 3, "[leaf, intermediate, root]");
    assert_eq!(chain[1], ca.intermediate_pem);
    assert_eq!(chain[2], ca.root_pem);
    assert_eq!(verify_chain(&chain).uris, vec![WEB.to_string()]);

    // The root is published for clients.
    let out = tempfile::tempdir().unwrap();
    let path = roots::publish_root(out.path(), loaded.signer.root_bundle()).unwrap();
    assert_eq!(std::fs::read_to_string(path).unwrap(), ca.root_pem);
}

#[test]
fn a_kubernetes_tls_secret_layout_works_too() {
    let ca = plugged_ca(Duration::from_secs(365 * 86400));
    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        &[
            ("tls.crt", &ca.intermediate_pem),
            ("tls.key", &ca.intermediate_key_pem),
            ("ca.crt", &ca.root_pem),
        ],
    );
    let now = OffsetDateTime::now_utc();
    let loaded = roots::load_plugged_in(dir.path(), now).unwrap();
    let (_key, csr) = ztunnel_csr(WEB);
    let chain = loaded
        .signer
        .sign_workload(
            &Csr::parse_pem(&csr).unwrap(),
            &web(),
            Duration::from_secs(3600),
            now,
        )
        .unwrap();
    assert_eq!(chain.len(), 3);
    verify_chain(&chain);
}

#[test]
fn ttl_is_clamped_to_the_signers_expiry() {
    let ca = plugged_ca(Duration::from_secs(3600));
    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        &[
            ("tls.crt", &ca.intermediate_pem),
            ("tls.key", &ca.intermediate_key_pem),
            ("ca.crt", &ca.root_pem),
        ],
    );
    let now = OffsetDateTime::now_utc();
    let loaded = roots::load_plugged_in(dir.path(), now).unwrap();
    let (_key, csr) = ztunnel_csr(WEB);
    let chain = loaded
        .signer
        .sign_workload(
            &Csr::parse_pem(&csr).unwrap(),
            &web(),
            Duration::from_secs(86400),
            now,
        )
        .unwrap();
    let leaf = verify_chain(&chain);
    assert_eq!(leaf.not_after, loaded.signer.not_after().unix_timestamp());
    assert!(leaf.not_after < now.unix_timestamp() + 3700);
}

#[test]
fn a_partial_or_wrong_plugged_in_ca_is_a_clear_error() {
    let ca = plugged_ca(Duration::from_secs(365 * 86400));
    let now = OffsetDateTime::now_utc();

    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        &[
            ("ca-cert.pem", &ca.intermediate_pem),
            ("ca-key.pem", &ca.intermediate_key_pem),
            ("root-cert.pem", &ca.root_pem),
        ],
    );
    let error = roots::load_plugged_in(dir.path(), now)
        .unwrap_err()
        .to_string();
    assert!(error.contains("cert-chain.pem is missing"), "{error}");

    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        &[("tls.crt", &ca.intermediate_pem), ("ca.crt", &ca.root_pem)],
    );
    let error = roots::load_plugged_in(dir.path(), now)
        .unwrap_err()
        .to_string();
    assert!(error.contains("tls.key is missing"), "{error}");

    let dir = tempfile::tempdir().unwrap();
    let error = roots::load_plugged_in(dir.path(), now)
        .unwrap_err()
        .to_string();
    assert!(error.contains("no CA files"), "{error}");

    // A key that is not the certificate's.
    let dir = tempfile::tempdir().unwrap();
    let other = KeyPair::generate().unwrap().serialize_pem();
    write(
        dir.path(),
        &[
            ("tls.crt", &ca.intermediate_pem),
            ("tls.key", &other),
            ("ca.crt", &ca.root_pem),
        ],
    );
    let error = roots::load_plugged_in(dir.path(), now)
        .unwrap_err()
        .to_string();
    assert!(error.contains("does not match"), "{error}");

    // A root bundle that is not the signer's root.
    let stranger = plugged_ca(Duration::from_secs(86400));
    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        &[
            ("tls.crt", &ca.intermediate_pem),
            ("tls.key", &ca.intermediate_key_pem),
            ("ca.crt", &stranger.root_pem),
        ],
    );
    let error = roots::load_plugged_in(dir.path(), now)
        .unwrap_err()
        .to_string();
    assert!(error.contains("does not chain"), "{error}");
}
