//! Service-account tokens shaped like Kubernetes' projected tokens, and the local key that
//! `ambientd token` mints them with (`token-key.pem` in the CA directory, which the server
//! always trusts). This is how a ztunnel run outside a cluster authenticates.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Args;
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header};
use rcgen::KeyPair;
use serde::{Deserialize, Serialize};

use crate::ca::keys::load_private_key;
use crate::ca::roots::{RootsError, write_atomic};

/// The local signing key's file in the CA directory.
pub const TOKEN_KEY: &str = "token-key.pem";
/// The `iss` of locally minted tokens.
pub const LOCAL_ISSUER: &str = "ambientd-local";
/// The audience ztunnel's projected token carries, and the default we require.
pub const DEFAULT_AUDIENCE: &str = "istio-ca";

/// A name and uid pair, as in the `kubernetes.io` claim.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ref {
    pub name: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub uid: String,
}

/// The `kubernetes.io` claim of a projected service-account token.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KubernetesClaim {
    pub namespace: String,
    pub serviceaccount: Ref,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<Ref>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<Ref>,
}

/// The claims ambientd reads from (and writes into) a service-account token.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claims {
    pub iss: String,
    pub sub: String,
    pub aud: Vec<String>,
    pub exp: u64,
    pub iat: u64,
    pub nbf: u64,
    #[serde(rename = "kubernetes.io")]
    pub kubernetes: KubernetesClaim,
}

/// The CA directory's token key: an ECDSA P-256 key used with ES256.
pub struct LocalKey {
    encoding: EncodingKey,
    decoding: DecodingKey,
    kid: String,
}

impl std::fmt::Debug for LocalKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalKey").field("kid", &self.kid).finish()
    }
}

impl LocalKey {
    /// Loads `<dir>/token-key.pem`, creating it (mode 0600) on first use.
    pub fn load_or_create(dir: &Path) -> Result<LocalKey, RootsError> {
        let path = dir.join(TOKEN_KEY);
        if !path.exists() {
            let key = KeyPair::generate().map_err(|e| RootsError::Generate(e.to_string()))?;
            std::fs::create_dir_all(dir).map_err(|source| RootsError::Write {
                path: dir.into(),
                source,
            })?;
            write_atomic(&path, key.serialize_pem().as_bytes(), true)?;
        }
        let pem = std::fs::read(&path).map_err(|source| RootsError::Read {
            path: path.clone(),
            source,
        })?;
        let key = load_private_key(&pem).map_err(|reason| RootsError::Invalid {
            path: path.clone(),
            reason,
        })?;
        if key.algorithm() != &rcgen::PKCS_ECDSA_P256_SHA256 {
            return Err(RootsError::Invalid {
                path,
                reason: "the token key must be ECDSA P-256".into(),
            });
        }
        let digest = ring::digest::digest(&ring::digest::SHA256, key.public_key_raw());
        let kid = digest.as_ref()[..8]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        Ok(LocalKey {
            encoding: EncodingKey::from_ec_der(&key.serialize_der()),
            decoding: DecodingKey::from_ec_der(key.public_key_raw()),
            kid,
        })
    }

    /// The key id in minted tokens' headers.
    pub fn kid(&self) -> &str {
        &self.kid
    }

    /// The public half, for validation.
    pub fn decoding_key(&self) -> &DecodingKey {
        &self.decoding
    }

    /// Signs `claims` as an ES256 JWT.
    pub fn mint(&self, claims: &Claims) -> Result<String, jsonwebtoken::errors::Error> {
        let mut header = Header::new(Algorithm::ES256);
        header.kid = Some(self.kid.clone());
        jsonwebtoken::encode(&header, claims, &self.encoding)
    }
}

/// Who the token is for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Subject {
    pub namespace: String,
    pub service_account: String,
    pub pod: Option<Ref>,
    pub node: Option<String>,
}

/// Claims for a locally minted token valid from `now` (seconds since the epoch) for `ttl`.
pub fn local_claims(subject: &Subject, audiences: &[String], now: u64, ttl: Duration) -> Claims {
    Claims {
        iss: LOCAL_ISSUER.to_string(),
        sub: format!(
            "system:serviceaccount:{}:{}",
            subject.namespace, subject.service_account
        ),
        aud: audiences.to_vec(),
        exp: now + ttl.as_secs(),
        iat: now,
        nbf: now,
        kubernetes: KubernetesClaim {
            namespace: subject.namespace.clone(),
            serviceaccount: Ref {
                name: subject.service_account.clone(),
                uid: String::new(),
            },
            pod: subject.pod.clone(),
            node: subject.node.clone().map(|name| Ref {
                name,
                uid: String::new(),
            }),
        },
    }
}

/// `ambientd token`: mint a projected-token-shaped JWT for a local ztunnel.
#[derive(Clone, Debug, Args)]
pub struct TokenArgs {
    /// The service account's namespace.
    #[arg(long, default_value = "istio-system")]
    pub namespace: String,
    /// The service account.
    #[arg(long, default_value = "ztunnel")]
    pub service_account: String,
    /// The pod the token is bound to (the `kubernetes.io.pod.name` claim).
    #[arg(long)]
    pub pod: Option<String>,
    /// The bound pod's uid; needed when the pod is in the served manifests with a uid.
    #[arg(long, requires = "pod")]
    pub pod_uid: Option<String>,
    /// The node the caller runs on; ztunnel may get certificates for pods on this node.
    #[arg(long)]
    pub node: Option<String>,
    /// Audiences (comma-separated).
    #[arg(long, default_value = DEFAULT_AUDIENCE, value_delimiter = ',')]
    pub audience: Vec<String>,
    /// Lifetime, such as 90m, 24h or 7d.
    #[arg(long, default_value = "24h", value_parser = parse_duration)]
    pub ttl: Duration,
    /// The CA directory holding token-key.pem (created if missing), as given to `serve`.
    #[arg(
        long,
        env = "AMBIENTD_CA_DIR",
        default_value = "ambientd-ca",
        value_name = "DIR"
    )]
    pub ca_dir: PathBuf,
    /// Write the token to FILE (no trailing newline) instead of standard output.
    #[arg(long, value_name = "FILE")]
    pub output: Option<PathBuf>,
}

/// Runs `ambientd token`.
pub fn run(args: TokenArgs) -> Result<(), String> {
    let key = LocalKey::load_or_create(&args.ca_dir).map_err(|e| e.to_string())?;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_err(|e| e.to_string())?
        .as_secs();
    let subject = Subject {
        namespace: args.namespace,
        service_account: args.service_account,
        pod: args.pod.map(|name| Ref {
            name,
            uid: args.pod_uid.unwrap_or_default(),
        }),
        node: args.node,
    };
    let token = key
        .mint(&local_claims(&subject, &args.audience, now, args.ttl))
        .map_err(|e| format!("signing the token: {e}"))?;
    match args.output {
        Some(path) => write_atomic(&path, token.as_bytes(), true).map_err(|e| e.to_string()),
        None => {
            // ztunnel uses a token file verbatim: a trailing newline breaks the header. Only a
            // terminal gets one.
            let stdout = std::io::stdout();
            let newline = if stdout.is_terminal() { "\n" } else { "" };
            print!("{token}{newline}");
            Ok(())
        }
    }
}

/// Parses `90s`, `15m`, `24h`, `7d` (or plain seconds).
pub fn parse_duration(value: &str) -> Result<Duration, String> {
    let value = value.trim();
    let split = value
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(value.len());
    let (number, unit) = value.split_at(split);
    let number: u64 = number
        .parse()
        .map_err(|_| format!("{value:?} is not a duration such as 90s, 15m, 24h or 7d"))?;
    let scale = match unit {
        "" | "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86400,
        _ => {
            return Err(format!(
                "{value:?}: unknown unit {unit:?} (use s, m, h or d)"
            ));
        }
    };
    number
        .checked_mul(scale)
        .map(Duration::from_secs)
        .ok_or_else(|| format!("{value:?} is too long"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("90"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("15m"), Ok(Duration::from_secs(900)));
        assert_eq!(parse_duration("24h"), Ok(Duration::from_secs(86400)));
        assert_eq!(parse_duration("90d"), Ok(Duration::from_secs(90 * 86400)));
        assert!(parse_duration("1y").is_err());
        assert!(parse_duration("h").is_err());
    }

    #[test]
    fn claims_have_the_projected_token_shape() {
        let subject = Subject {
            namespace: "istio-system".into(),
            service_account: "ztunnel".into(),
            pod: Some(Ref {
                name: "ztunnel-x".into(),
                uid: "u1".into(),
            }),
            node: Some("node-a".into()),
        };
        let claims = local_claims(
            &subject,
            &["istio-ca".into()],
            1000,
            Duration::from_secs(60),
        );
        let json = serde_json::to_value(&claims).unwrap();
        assert_eq!(json["sub"], "system:serviceaccount:istio-system:ztunnel");
        assert_eq!(json["aud"][0], "istio-ca");
        assert_eq!(json["exp"], 1060);
        assert_eq!(json["kubernetes.io"]["namespace"], "istio-system");
        assert_eq!(json["kubernetes.io"]["serviceaccount"]["name"], "ztunnel");
        assert_eq!(json["kubernetes.io"]["pod"]["name"], "ztunnel-x");
        assert_eq!(json["kubernetes.io"]["pod"]["uid"], "u1");
        assert_eq!(json["kubernetes.io"]["node"]["name"], "node-a");
    }
}
