//! Private keys and PEM: loading CA keys in the forms operators have (PKCS#8, SEC1
//! `EC PRIVATE KEY`, PKCS#1 `RSA PRIVATE KEY`), random serial numbers, and splitting PEM bundles.

use rcgen::KeyPair;
use ring::rand::{SecureRandom, SystemRandom};
use rustls::pki_types::CertificateDer;

/// `id-ecPublicKey`, `prime256v1`, `secp384r1` and `rsaEncryption` as DER-encoded OIDs.
const OID_EC_PUBLIC_KEY: &[u8] = &[0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01];
const OID_P256: &[u8] = &[0x06, 0x08, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07];
const OID_P384: &[u8] = &[0x06, 0x05, 0x2b, 0x81, 0x04, 0x00, 0x22];
const OID_RSA: &[u8] = &[
    0x06, 0x09, 0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x01,
];
const DER_NULL: &[u8] = &[0x05, 0x00];

/// One PEM block: its label and DER contents.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PemBlock {
    pub label: String,
    pub der: Vec<u8>,
}

/// Every PEM block in `text`, in order. Text between blocks is ignored.
pub fn pem_blocks(text: &[u8]) -> Result<Vec<PemBlock>, String> {
    Ok(pem::parse_many(text)
        .map_err(|e| format!("bad PEM: {e}"))?
        .into_iter()
        .map(|p| PemBlock {
            label: p.tag().to_string(),
            der: p.into_contents(),
        })
        .collect())
}

/// The `CERTIFICATE` blocks of `text` as DER.
pub fn certificates(text: &[u8]) -> Result<Vec<CertificateDer<'static>>, String> {
    Ok(pem_blocks(text)?
        .into_iter()
        .filter(|b| b.label == "CERTIFICATE")
        .map(|b| CertificateDer::from(b.der))
        .collect())
}

/// PEM text for one certificate, ending in `\n`.
pub fn certificate_pem(der: &[u8]) -> String {
    pem_encode("CERTIFICATE", der)
}

/// PEM text with 64-column lines and `\n` line ends, ending in `\n`.
pub fn pem_encode(label: &str, der: &[u8]) -> String {
    pem::encode_config(
        &pem::Pem::new(label, der),
        pem::EncodeConfig::default().set_line_ending(pem::LineEnding::LF),
    )
}

/// Loads the first private key in `pem`: PKCS#8 (`PRIVATE KEY`: EC P-256/P-384, RSA),
/// SEC1 (`EC PRIVATE KEY`, P-256/P-384, with its public key) or PKCS#1 (`RSA PRIVATE KEY`).
pub fn load_private_key(pem: &[u8]) -> Result<KeyPair, String> {
    let blocks = pem_blocks(pem)?;
    let block = blocks
        .iter()
        .find(|b| b.label.ends_with("PRIVATE KEY"))
        .ok_or("no PRIVATE KEY block")?;
    let unsupported = |e: rcgen::Error| format!("unsupported {} ({e})", block.label);
    match block.label.as_str() {
        "PRIVATE KEY" => KeyPair::try_from(block.der.as_slice()).map_err(unsupported),
        "EC PRIVATE KEY" => {
            let mut last = None;
            for curve in [OID_P256, OID_P384] {
                let algorithm = der_sequence(&[OID_EC_PUBLIC_KEY, curve].concat());
                match KeyPair::try_from(pkcs8_wrap(&algorithm, &block.der).as_slice()) {
                    Ok(key) => return Ok(key),
                    Err(e) => last = Some(e),
                }
            }
            Err(unsupported(
                last.unwrap_or(rcgen::Error::CouldNotParseKeyPair),
            ))
        }
        "RSA PRIVATE KEY" => {
            let algorithm = der_sequence(&[OID_RSA, DER_NULL].concat());
            KeyPair::try_from(pkcs8_wrap(&algorithm, &block.der).as_slice()).map_err(unsupported)
        }
        other => Err(format!("unsupported key type {other:?}")),
    }
}

/// `PrivateKeyInfo ::= SEQUENCE { version 0, algorithm, privateKey OCTET STRING }`.
fn pkcs8_wrap(algorithm: &[u8], key: &[u8]) -> Vec<u8> {
    let version = [0x02, 0x01, 0x00];
    let octets = der_tlv(0x04, key);
    der_sequence(&[&version[..], algorithm, &octets].concat())
}

fn der_sequence(content: &[u8]) -> Vec<u8> {
    der_tlv(0x30, content)
}

fn der_tlv(tag: u8, content: &[u8]) -> Vec<u8> {
    let mut out = vec![tag];
    let len = content.len();
    if len < 0x80 {
        out.push(len as u8);
    } else {
        let bytes = len.to_be_bytes();
        let skip = bytes.iter().take_while(|b| **b == 0).count();
        out.push(0x80 | (bytes.len() - skip) as u8);
        out.extend_from_slice(&bytes[skip..]);
    }
    out.extend_from_slice(content);
    out
}

/// A random positive 128-bit certificate serial number.
pub fn random_serial() -> rcgen::SerialNumber {
    let mut bytes = [0u8; 16];
    // SystemRandom only fails if the OS has no randomness, in which case nothing works.
    SystemRandom::new()
        .fill(&mut bytes)
        .expect("the OS random number generator failed");
    bytes[0] &= 0x7f;
    bytes[0] |= 0x01;
    rcgen::SerialNumber::from_slice(&bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pem_round_trips() {
        let der: Vec<u8> = (0..=255u8).cycle().take(700).collect();
        let text = pem_encode("CERTIFICATE", &der);
        assert!(text.ends_with("-----END CERTIFICATE-----\n"));
        assert!(text.lines().all(|l| l.len() <= 64));
        let blocks = pem_blocks(text.as_bytes()).unwrap();
        assert_eq!(
            blocks,
            vec![PemBlock {
                label: "CERTIFICATE".into(),
                der
            }]
        );
    }

    #[test]
    fn loads_pkcs8_and_sec1_keys() {
        let key = KeyPair::generate().unwrap();
        let loaded = load_private_key(key.serialize_pem().as_bytes()).unwrap();
        assert_eq!(loaded.public_key_raw(), key.public_key_raw());

        // SEC1 is the PKCS#8 payload: PrivateKeyInfo's OCTET STRING.
        let pkcs8 = key.serialize_der();
        let parsed = x509_parser::der_parser::parse_der(&pkcs8).unwrap().1;
        let sec1 = parsed.as_sequence().unwrap()[2]
            .as_slice()
            .unwrap()
            .to_vec();
        let loaded = load_private_key(pem_encode("EC PRIVATE KEY", &sec1).as_bytes()).unwrap();
        assert_eq!(loaded.public_key_raw(), key.public_key_raw());

        assert!(load_private_key(b"nothing here").is_err());
    }
}
