//! The CA's material in a cluster: Secrets in the system namespace, so every replica signs
//! with the same CA and a restart never changes the root.
//!
//! * `cacerts` (istiod's plugged-in CA: `ca-cert.pem`, `ca-key.pem`, `root-cert.pem`,
//!   `cert-chain.pem`, or `tls.crt`/`tls.key`/`ca.crt`) wins when present.
//! * Otherwise `istio-ca-secret` (type `istio.io/ca-root`; `ca-cert.pem`, `ca-key.pem`,
//!   `root-cert.pem` = the CA certificate, and empty `cert-chain.pem` and `key.pem`), istiod's
//!   self-signed CA. When absent, any replica generates one and **creates** it: the API
//!   server's create is atomic, so of replicas racing one wins and the others, answered 409
//!   AlreadyExists, re-read and use the winner's. Creating (rather than leaving it to the
//!   leader) lets a replica start serving without waiting for an election.
//!
//! The chosen Secret's files are written to a directory (`<ca-dir>/cluster-ca`) that the CA
//! loads as a plugged-in CA, so the CA's reload of changed files does the rest. [`run`] watches
//! both Secrets: a change is written out (and reloaded); a deleted `istio-ca-secret` is
//! re-created by the leader from the material in use, so the root stays the same.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ObjectMeta, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use time::OffsetDateTime;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::ca::roots::{self, CA_CERT, CA_KEY, CERT_CHAIN, ROOT_CERT, TLS_CA, TLS_CERT, TLS_KEY};
use crate::kube::leader::Leadership;

/// istiod's self-signed CA Secret.
pub const CA_SECRET: &str = "istio-ca-secret";
/// istiod's plugged-in CA Secret.
pub const CACERTS_SECRET: &str = "cacerts";
/// The type of `istio-ca-secret`.
pub const CA_SECRET_TYPE: &str = "istio.io/ca-root";
/// Where, under `--ca-dir`, the Secret's files are written for the CA to load.
pub const MATERIAL_DIR: &str = "cluster-ca";

/// Every file name the CA reads from a plugged-in directory.
const CA_FILES: [&str; 7] = [
    CA_CERT, CA_KEY, ROOT_CERT, CERT_CHAIN, TLS_CERT, TLS_KEY, TLS_CA,
];

#[derive(Debug, thiserror::Error)]
pub enum CaSecretError {
    #[error("reading Secret {namespace}/{name}: {source}")]
    Read {
        namespace: String,
        name: String,
        source: kube::Error,
    },
    #[error("creating Secret {namespace}/{CA_SECRET}: {source}")]
    Create {
        namespace: String,
        source: kube::Error,
    },
    #[error("Secret {namespace}/{name} holds no CA files")]
    Empty { namespace: String, name: String },
    #[error(transparent)]
    Roots(#[from] roots::RootsError),
}

/// Which Secret the material came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    PluggedIn,
    SelfSigned,
}

/// CA files by name, as in the Secret.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Material {
    pub origin: Origin,
    pub files: BTreeMap<String, Vec<u8>>,
}

/// The CA Secrets of one namespace.
#[derive(Clone)]
pub struct CaSecrets {
    api: Api<Secret>,
    namespace: String,
    trust_domain: String,
    dir: PathBuf,
}

impl std::fmt::Debug for CaSecrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CaSecrets")
            .field("namespace", &self.namespace)
            .field("dir", &self.dir)
            .finish()
    }
}

impl CaSecrets {
    /// The Secrets in `namespace`, written out under `ca_dir`.
    pub fn new(client: kube::Client, namespace: &str, trust_domain: &str, ca_dir: &Path) -> Self {
        CaSecrets {
            api: Api::namespaced(client, namespace),
            namespace: namespace.to_string(),
            trust_domain: trust_domain.to_string(),
            dir: ca_dir.join(MATERIAL_DIR),
        }
    }

    /// The directory the CA loads (as `--cacerts`).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Reads `cacerts`, else `istio-ca-secret`, creating the latter if neither exists, and
    /// writes the files out. Call before starting the CA.
    pub async fn ensure(&self) -> Result<Material, CaSecretError> {
        let material = match self.read(CACERTS_SECRET).await? {
            Some(secret) => self.material(CACERTS_SECRET, Origin::PluggedIn, &secret)?,
            None => match self.read(CA_SECRET).await? {
                Some(secret) => self.material(CA_SECRET, Origin::SelfSigned, &secret)?,
                None => self.create_self_signed().await?,
            },
        };
        write_out(&self.dir, &material)?;
        Ok(material)
    }

    /// [`ensure`](Self::ensure), retried with backoff (0.5 s doubling to 30 s) until it
    /// succeeds; `None` if `stop` comes first. A replica cannot sign without its CA, so it
    /// waits for the API server rather than inventing a root of its own.
    pub async fn ensure_retrying(&self, stop: &CancellationToken) -> Option<Material> {
        let mut delay = Duration::from_millis(500);
        loop {
            match self.ensure().await {
                Ok(material) => return Some(material),
                Err(error) => {
                    warn!(%error, retry_in = ?delay, "cannot load the CA from its Secrets")
                }
            }
            tokio::select! {
                _ = stop.cancelled() => return None,
                _ = tokio::time::sleep(delay) => {}
            }
            delay = (delay * 2).min(Duration::from_secs(30));
        }
    }

    async fn read(&self, name: &str) -> Result<Option<Secret>, CaSecretError> {
        self.api
            .get_opt(name)
            .await
            .map_err(|source| CaSecretError::Read {
                namespace: self.namespace.clone(),
                name: name.to_string(),
                source,
            })
    }

    fn material(
        &self,
        name: &str,
        origin: Origin,
        secret: &Secret,
    ) -> Result<Material, CaSecretError> {
        let mut files: BTreeMap<String, Vec<u8>> = secret
            .data
            .iter()
            .flatten()
            .filter(|(key, _)| CA_FILES.contains(&key.as_str()))
            .map(|(key, value)| (key.clone(), value.0.clone()))
            .collect();
        if origin == Origin::SelfSigned {
            // istiod's layout: root-cert.pem is the CA certificate; the chain is empty.
            files.retain(|key, _| [CA_CERT, CA_KEY, ROOT_CERT, CERT_CHAIN].contains(&key.as_str()));
            if let Some(cert) = files.get(CA_CERT).cloned() {
                files
                    .entry(ROOT_CERT.into())
                    .and_modify(|r| {
                        if r.is_empty() {
                            *r = cert.clone()
                        }
                    })
                    .or_insert(cert);
            }
            files.entry(CERT_CHAIN.into()).or_default();
        }
        if files.is_empty() {
            return Err(CaSecretError::Empty {
                namespace: self.namespace.clone(),
                name: name.to_string(),
            });
        }
        Ok(Material { origin, files })
    }

    /// Generates a root and creates `istio-ca-secret`; if another replica created it first,
    /// uses theirs.
    async fn create_self_signed(&self) -> Result<Material, CaSecretError> {
        let generated = roots::self_signed_pem(&self.trust_domain, OffsetDateTime::now_utc())?;
        let secret = ca_secret(generated.cert_pem.as_bytes(), generated.key_pem.as_bytes());
        match self.api.create(&PostParams::default(), &secret).await {
            Ok(created) => {
                info!(namespace = %self.namespace, "generated a self-signed root CA and stored it in Secret {CA_SECRET}");
                self.material(CA_SECRET, Origin::SelfSigned, &created)
            }
            Err(kube::Error::Api(status)) if status.code == 409 => {
                info!(namespace = %self.namespace, "another replica created Secret {CA_SECRET} first; using it");
                let winner = self.read(CA_SECRET).await?.ok_or(CaSecretError::Empty {
                    namespace: self.namespace.clone(),
                    name: CA_SECRET.into(),
                })?;
                self.material(CA_SECRET, Origin::SelfSigned, &winner)
            }
            Err(source) => Err(CaSecretError::Create {
                namespace: self.namespace.clone(),
                source,
            }),
        }
    }

    /// Follows both Secrets until `stop`: changes are written out for the CA to reload; a
    /// deleted `istio-ca-secret` whose material is in use is re-created by the leader.
    pub async fn run(self, mut current: Material, leadership: Leadership, stop: CancellationToken) {
        let watch = |name: &str| {
            let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
            watcher(self.api.clone(), config).default_backoff().boxed()
        };
        let mut plugged = watch(CACERTS_SECRET);
        let mut stored = watch(CA_SECRET);
        let mut cacerts = Followed::default();
        let mut ca_secret = Followed::default();
        let mut leader = leadership.clone();
        let mut retry = tokio::time::interval(Duration::from_secs(5));
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                Some(event) = plugged.next() => cacerts.apply(event),
                Some(event) = stored.next() => ca_secret.apply(event),
                _ = leader.changed() => {}
                _ = retry.tick() => {}
            }
            if !(cacerts.listed && ca_secret.listed) {
                continue;
            }
            let wanted = match (&cacerts.current, &ca_secret.current) {
                (Some(secret), _) => self.material(CACERTS_SECRET, Origin::PluggedIn, secret),
                (None, Some(secret)) => self.material(CA_SECRET, Origin::SelfSigned, secret),
                (None, None) => {
                    if current.origin == Origin::SelfSigned && leadership.is_leader() {
                        self.restore(&current).await;
                    }
                    continue;
                }
            };
            match wanted {
                Ok(material) if material != current => match write_out(&self.dir, &material) {
                    Ok(()) => {
                        info!(origin = ?material.origin, "the CA Secret changed; reloading the CA");
                        current = material;
                    }
                    Err(error) => warn!(%error, "cannot write the CA files; retrying"),
                },
                Ok(_) => {}
                Err(error) => warn!(%error, "keeping the current CA"),
            }
        }
    }

    /// Re-creates a deleted `istio-ca-secret` from the material in use.
    async fn restore(&self, current: &Material) {
        let (Some(cert), Some(key)) = (current.files.get(CA_CERT), current.files.get(CA_KEY))
        else {
            return;
        };
        match self
            .api
            .create(&PostParams::default(), &ca_secret(cert, key))
            .await
        {
            Ok(_) => {
                info!(namespace = %self.namespace, "re-created the deleted Secret {CA_SECRET} with the CA in use")
            }
            Err(kube::Error::Api(status)) if status.code == 409 => {}
            Err(error) => warn!(%error, "cannot re-create Secret {CA_SECRET}; retrying"),
        }
    }
}

/// The one object a name-selected watch follows; a re-list is buffered until it is done.
#[derive(Default)]
struct Followed {
    current: Option<Secret>,
    relisting: Option<Option<Secret>>,
    listed: bool,
}

impl Followed {
    fn apply(&mut self, event: Result<watcher::Event<Secret>, watcher::Error>) {
        match event {
            Ok(watcher::Event::Init) => self.relisting = Some(None),
            Ok(watcher::Event::InitApply(secret)) => self.relisting = Some(Some(secret)),
            Ok(watcher::Event::InitDone) => {
                self.current = self.relisting.take().flatten();
                self.listed = true;
            }
            Ok(watcher::Event::Apply(secret)) => self.current = Some(secret),
            Ok(watcher::Event::Delete(_)) => self.current = None,
            Err(error) => warn!(%error, "watching the CA Secrets"),
        }
    }
}

/// `istio-ca-secret` in istiod's layout.
fn ca_secret(cert_pem: &[u8], key_pem: &[u8]) -> Secret {
    let data = [
        (CA_CERT, cert_pem),
        (CA_KEY, key_pem),
        (ROOT_CERT, cert_pem),
        (CERT_CHAIN, &[][..]),
        ("key.pem", &[][..]),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), ByteString(v.to_vec())))
    .collect();
    Secret {
        metadata: ObjectMeta {
            name: Some(CA_SECRET.into()),
            ..ObjectMeta::default()
        },
        type_: Some(CA_SECRET_TYPE.into()),
        data: Some(data),
        ..Secret::default()
    }
}

/// Writes `material` into `dir` (each file atomically, keys private) and removes CA files it
/// does not have, so a layout switch leaves no stale half.
fn write_out(dir: &Path, material: &Material) -> Result<(), roots::RootsError> {
    std::fs::create_dir_all(dir).map_err(|source| roots::RootsError::Write {
        path: dir.into(),
        source,
    })?;
    for (name, bytes) in &material.files {
        let path = dir.join(name);
        if std::fs::read(&path).is_ok_and(|b| b == *bytes) {
            continue;
        }
        let secret = name.contains("key");
        roots::write_atomic(&path, bytes, secret)?;
    }
    for name in CA_FILES {
        if !material.files.contains_key(name) {
            let _ = std::fs::remove_file(dir.join(name));
        }
    }
    Ok(())
}
