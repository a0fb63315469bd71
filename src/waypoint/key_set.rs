//! Whether Envoy's `jwt_authn` accepts a key set inline. Envoy refuses a whole listener whose
//! provider has a `local_jwks` it cannot read ("invalid local jwks"), and the waypoint then
//! keeps its old config for every service; so a key set goes into a config only after this
//! check, and a RequestAuthentication whose inline `jwks` fails it is refused when decoded.
//!
//! The rules are those of the library Envoy parses key sets with (google/jwt_verify_lib,
//! `src/jwks.cc`): a JSON object with a `keys` array, of which at least one key is usable;
//! other keys are skipped. A key is usable when its `kty` is `RSA` (`alg` empty or `RS*`/`PS*`,
//! `n` and `e` in base64url, `e` 3 or 65537, `n` odd and above `e`), `EC` (`alg` `ES*`, a
//! P-256/384/521
//! curve agreeing with `alg`, `x` and `y` of the curve's size), `oct` (`alg` empty or
//! `HS256/384/512`, a non-empty `k`) or `OKP` (`Ed25519`, a 32-byte `x`). The library's curve
//! check (that the point is on the curve) is not repeated here: a key set whose only key fails
//! just that would still be refused by Envoy. The X.509 form (a map of key ids to
//! certificates) is not taken, as istiod does not take it from a `jwksUri`.

use serde_json::{Map, Value};

/// How many keys of `text` Envoy can use, or why it would refuse the set.
pub fn check_key_set(text: &str) -> Result<usize, String> {
    let value: Value = serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))?;
    let Some(keys) = value.get("keys") else {
        return Err("no \"keys\"".into());
    };
    let Some(keys) = keys.as_array() else {
        return Err("\"keys\" is not an array".into());
    };
    let mut reasons = Vec::new();
    let mut usable = 0;
    for (i, key) in keys.iter().enumerate() {
        match key.as_object().map(usable_key) {
            Some(Ok(())) => usable += 1,
            Some(Err(reason)) => reasons.push(format!("keys[{i}]: {reason}")),
            None => reasons.push(format!("keys[{i}]: not an object")),
        }
    }
    if usable == 0 {
        if reasons.is_empty() {
            return Err("no keys".into());
        }
        return Err(format!("no usable key ({})", reasons.join("; ")));
    }
    Ok(usable)
}

fn usable_key(key: &Map<String, Value>) -> Result<(), String> {
    let kty = match key.get("kty") {
        Some(Value::String(kty)) => kty.as_str(),
        Some(_) => return Err("kty is not a string".into()),
        None => return Err("no kty".into()),
    };
    // A non-string `alg` is ignored, as the library ignores it.
    let alg = key.get("alg").and_then(Value::as_str).unwrap_or("");
    let field = |name: &str| match key.get(name) {
        Some(Value::String(text)) => {
            base64url(text).ok_or_else(|| format!("{name} is not base64url"))
        }
        Some(_) => Err(format!("{name} is not a string")),
        None => Err(format!("no {name}")),
    };
    match kty {
        "RSA" => {
            if !(alg.is_empty() || alg.starts_with("RS") || alg.starts_with("PS")) {
                return Err(format!("alg {alg} is not an RSA signature algorithm"));
            }
            let n = field("n")?;
            let e = field("e")?;
            let e = strip_zeros(&e);
            if e != [3] && e != [1, 0, 1] {
                return Err("e is neither 3 nor 65537".into());
            }
            // BoringSSL's `RSA_check_key`: odd, at most 16384 bits, more than `e`.
            let n = strip_zeros(&n);
            if n.last().is_none_or(|low| low % 2 == 0) || n.len() > 2048 || n.len() < 4 {
                return Err("n is not an RSA modulus".into());
            }
            Ok(())
        }
        "EC" => {
            if !alg.is_empty() && !alg.starts_with("ES") {
                return Err(format!("alg {alg} is not an ECDSA algorithm"));
            }
            let crv = match key.get("crv") {
                Some(Value::String(crv)) => crv.as_str(),
                Some(_) => return Err("crv is not a string".into()),
                None => "",
            };
            let by_alg = match alg {
                "ES256" => Some("P-256"),
                "ES384" => Some("P-384"),
                "ES512" => Some("P-521"),
                _ => None,
            };
            if !alg.is_empty() && !crv.is_empty() && by_alg != Some(crv) {
                return Err(format!("alg {alg} and crv {crv} disagree"));
            }
            let size = match by_alg.unwrap_or(if crv.is_empty() && alg.is_empty() {
                "P-256"
            } else {
                crv
            }) {
                "P-256" => 32,
                "P-384" => 48,
                "P-521" => 66,
                other => return Err(format!("curve {other:?} is not supported")),
            };
            for coordinate in ["x", "y"] {
                if strip_zeros(&field(coordinate)?).len() > size {
                    return Err(format!("{coordinate} is longer than the curve's"));
                }
            }
            Ok(())
        }
        "oct" => {
            if !matches!(alg, "" | "HS256" | "HS384" | "HS512") {
                return Err(format!("alg {alg} is not an HMAC algorithm"));
            }
            if field("k")?.is_empty() {
                return Err("k is empty".into());
            }
            Ok(())
        }
        "OKP" => {
            if !alg.is_empty() && alg != "EdDSA" {
                return Err(format!("alg {alg} is not EdDSA"));
            }
            match key.get("crv") {
                Some(Value::String(crv)) if crv == "Ed25519" => {}
                Some(Value::String(crv)) => return Err(format!("curve {crv:?} is not supported")),
                Some(_) => return Err("crv is not a string".into()),
                None => return Err("no crv".into()),
            }
            if field("x")?.len() != 32 {
                return Err("x is not 32 bytes".into());
            }
            Ok(())
        }
        other => Err(format!("kty {other:?} is not supported")),
    }
}

fn strip_zeros(bytes: &[u8]) -> &[u8] {
    let start = bytes.iter().position(|b| *b != 0).unwrap_or(bytes.len());
    &bytes[start..]
}

/// Base64url, with or without padding; `None` on any other character.
fn base64url(text: &str) -> Option<Vec<u8>> {
    let text = text.trim_end_matches('=');
    let mut out = Vec::with_capacity(text.len() * 3 / 4);
    let mut buffer = 0u32;
    let mut bits = 0;
    for c in text.bytes() {
        let value = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'-' => 62,
            b'_' => 63,
            _ => return None,
        };
        buffer = (buffer << 6) | u32::from(value);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((buffer >> bits) as u8);
            buffer &= (1 << bits) - 1;
        }
    }
    // A single leftover character carries no whole byte.
    (bits < 6).then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64url_with_and_without_padding() {
        assert_eq!(base64url("AQAB"), Some(vec![1, 0, 1]));
        assert_eq!(base64url("AQ"), Some(vec![1]));
        assert_eq!(base64url("AQ=="), Some(vec![1]));
        assert_eq!(base64url("-_8"), Some(vec![0xfb, 0xff]));
        assert_eq!(base64url("A"), None);
        assert_eq!(base64url("a+b/"), None);
        assert_eq!(base64url(""), Some(vec![]));
    }

    const N: &str = "01kA6YazNqjp1JUPBpWJJKe76yW5GUX6NbdzrhME3S7ElKBEq9zhGZBqKi1G2JLiCMFWB9rK9SKnlv8O6Qt__vtwvt82WEWN1slK4k41OPyHKBfSkYdr45BjTVzKORvBwablDQQKUt5qPqp0KNFvfDWX95J6lgVTLE6Gockcw36EX5b1_iCcjAkU7yzaDGDHG3W9dhH0d5UDaTQWffpvVK6w-h2ugeUig7xONo7JbZHeC_jQgLtkg_79tvODohsnEPmtl6vvQYE6f9NEF0qUhru4srnTGzDA0QjxBbXdXT4NqjvRLEVb5FIijMKMnGA6geqp5K1nXRn0ZQd84k_ldw";
    const X: &str = "VXVkC_DOoEmNESjUIriZ9f_SOSC2vV0HcrpWNry3NZE";
    const Y: &str = "ZbaMLwmT3xfYe8ZX1ycNQGgFY7mag-nYdzDizVbSzR0";

    fn one(key: Value) -> Result<usize, String> {
        check_key_set(&serde_json::json!({ "keys": [key] }).to_string())
    }

    #[test]
    fn usable_keys_of_each_type() {
        let keys = [
            serde_json::json!({"kty": "RSA", "n": N, "e": "AQAB"}),
            serde_json::json!({"kty": "RSA", "alg": "PS256", "n": N, "e": "Aw"}),
            serde_json::json!({"kty": "EC", "crv": "P-256", "x": X, "y": Y}),
            serde_json::json!({"kty": "EC", "alg": "ES256", "x": X, "y": Y}),
            serde_json::json!({"kty": "EC", "x": X, "y": Y}),
            serde_json::json!({"kty": "oct", "alg": "HS256", "k": "c2VjcmV0"}),
            serde_json::json!({"kty": "OKP", "crv": "Ed25519", "x": X}),
        ];
        for key in keys {
            assert_eq!(one(key.clone()), Ok(1), "{key}");
        }
    }

    #[test]
    fn keys_envoy_skips() {
        let keys = [
            serde_json::json!({"n": N, "e": "AQAB"}),
            serde_json::json!({"kty": 1, "n": N, "e": "AQAB"}),
            serde_json::json!({"kty": "RSA", "alg": "HS256", "n": N, "e": "AQAB"}),
            serde_json::json!({"kty": "RSA", "n": N, "e": "AAE"}),
            serde_json::json!({"kty": "RSA", "n": "AQAB", "e": "AQAB"}),
            serde_json::json!({"kty": "RSA", "n": "AAAA", "e": "AQAB"}),
            serde_json::json!({"kty": "RSA", "n": "not base64!", "e": "AQAB"}),
            serde_json::json!({"kty": "RSA", "e": "AQAB"}),
            serde_json::json!({"kty": "EC", "alg": "ES384", "crv": "P-256", "x": X, "y": Y}),
            serde_json::json!({"kty": "EC", "crv": "secp256k1", "x": X, "y": Y}),
            serde_json::json!({"kty": "EC", "alg": "RS256", "x": X, "y": Y}),
            serde_json::json!({"kty": "EC", "alg": "ECDH-ES", "crv": "P-256", "x": X, "y": Y}),
            serde_json::json!({"kty": "EC", "crv": "P-256", "x": X}),
            serde_json::json!({"kty": "EC", "crv": "P-256", "x": N, "y": Y}),
            serde_json::json!({"kty": "oct", "alg": "HS1", "k": "c2VjcmV0"}),
            serde_json::json!({"kty": "oct", "k": ""}),
            serde_json::json!({"kty": "OKP", "crv": "X25519", "x": X}),
            serde_json::json!({"kty": "OKP", "crv": "Ed25519", "x": "AQAB"}),
            serde_json::json!({"kty": "OKP", "x": X}),
            serde_json::json!({"kty": "oth"}),
            serde_json::json!("a string"),
        ];
        for key in keys {
            let error = one(key.clone()).unwrap_err();
            assert!(
                error.starts_with("no usable key (keys[0]: "),
                "{key}: {error}"
            );
        }
        // One usable key is enough; the others are skipped.
        let mixed = serde_json::json!({"keys": [
            {"kty": "EC", "alg": "ECDH-ES", "use": "enc", "crv": "P-256", "x": X, "y": Y},
            {"kty": "EC", "crv": "P-256", "x": X, "y": Y},
        ]});
        assert_eq!(check_key_set(&mixed.to_string()), Ok(1));
        // The library reads only the first two letters of an RSA key's `alg`: an RSA-OAEP
        // (encryption) key is taken, as Envoy takes it.
        assert_eq!(
            one(serde_json::json!({"kty": "RSA", "alg": "RSA-OAEP", "n": N, "e": "AQAB"})),
            Ok(1)
        );
    }

    #[test]
    fn sets_envoy_refuses() {
        for (text, why) in [
            ("not json", "not JSON"),
            ("[]", "no \"keys\""),
            (r#"{"kid": "-----BEGIN CERTIFICATE-----\n"}"#, "no \"keys\""),
            (r#"{"keys": {}}"#, "not an array"),
            (r#"{"keys": []}"#, "no keys"),
        ] {
            let error = check_key_set(text).unwrap_err();
            assert!(error.contains(why), "{text}: {error}");
        }
    }
}
