//! Who may have which certificate, and who may read xDS on 15012: pure decisions, no I/O.
//!
//! The rules follow istiod. A caller gets a certificate for its own authenticated identity.
//! With `ImpersonatedIdentity` (ztunnel in shared mode) the caller must be a trusted node
//! account, its node must be known (from the token's pod binding checked against the index, or
//! from a local token's node claim), and at least one pod with the requested identity must be
//! scheduled on that node. Every refusal carries a reason for the log; the caller only ever
//! sees "unauthenticated".

use std::fmt;

use crate::ca::identity::SpiffeId;
use crate::ca::pods::PodIndex;

/// The pod a service-account token is bound to (`kubernetes.io.pod` claim).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodBinding {
    pub name: String,
    /// The pod's `metadata.uid`, when the token carries one.
    pub uid: Option<String>,
}

/// How a caller proved who it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Method {
    /// A client certificate with a SPIFFE URI SAN, verified against our roots.
    ClientCertificate,
    /// A service-account JWT validated against configured keys (JWKS) or TokenReview.
    ServiceAccountToken,
    /// A token minted by `ambientd token` with the CA directory's local key.
    LocalToken,
}

impl fmt::Display for Method {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Method::ClientCertificate => "client-certificate",
            Method::ServiceAccountToken => "service-account-token",
            Method::LocalToken => "local-token",
        })
    }
}

/// An authenticated caller.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Caller {
    pub identity: SpiffeId,
    pub method: Method,
    /// The pod the token is bound to, if any.
    pub pod: Option<PodBinding>,
    /// The token's node claim (`kubernetes.io.node.name`), if any. Trusted on its own only for
    /// [`Method::LocalToken`]; otherwise it must agree with the index.
    pub node: Option<String>,
}

/// The impersonation policy: which `namespace/service-account` pairs are node agents.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Policy {
    pub trusted_node_accounts: Vec<(String, String)>,
    /// The mesh trust domain; impersonated identities must be in it.
    pub trust_domain: String,
}

impl Policy {
    /// Parses `ns/sa,ns/sa` (the format of istiod's `CA_TRUSTED_NODE_ACCOUNTS`).
    pub fn parse_accounts(list: &str) -> Result<Vec<(String, String)>, String> {
        list.split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(|entry| match entry.split_once('/') {
                Some((ns, sa)) if !ns.is_empty() && !sa.is_empty() && !sa.contains('/') => {
                    Ok((ns.to_string(), sa.to_string()))
                }
                _ => Err(format!("{entry:?} is not namespace/service-account")),
            })
            .collect()
    }

    fn is_node_account(&self, id: &SpiffeId) -> bool {
        self.trusted_node_accounts
            .iter()
            .any(|(ns, sa)| *ns == id.namespace && *sa == id.service_account)
    }
}

/// Why a request was refused. Logged; never sent to the caller.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The requested identity is not `spiffe://<our trust domain>/ns/X/sa/Y`.
    BadImpersonatedIdentity(String),
    /// No node accounts are configured, so nobody may impersonate.
    NoTrustedNodeAccounts,
    /// The caller is not one of the trusted node accounts.
    NotNodeAccount(SpiffeId),
    /// The caller has no pod binding and no trusted node claim.
    NoNode(SpiffeId),
    /// The token's pod is not in the index.
    CallerPodNotFound { namespace: String, pod: String },
    /// The indexed pod runs as another service account than the token's.
    CallerPodServiceAccount { pod: String, indexed: String },
    /// The token's pod uid differs from the indexed pod's uid.
    CallerPodUid {
        pod: String,
        token: Option<String>,
        indexed: String,
    },
    /// The token's node claim differs from the indexed pod's node.
    CallerNodeMismatch { claim: String, indexed: String },
    /// No pod with the requested identity is scheduled on the caller's node.
    NoPodOnNode { identity: SpiffeId, node: String },
    /// xDS on 15012: the caller's namespace is not the proxy's namespace.
    XdsNamespace { caller: SpiffeId, proxy: String },
    /// xDS on 15012: the caller's service account is not the proxy's (when the node names one).
    XdsServiceAccount { caller: SpiffeId, proxy: String },
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::BadImpersonatedIdentity(id) => write!(
                f,
                "impersonated identity {id:?} is not spiffe://<trust domain>/ns/<ns>/sa/<sa> in our trust domain"
            ),
            Refusal::NoTrustedNodeAccounts => {
                f.write_str("impersonation requested but no trusted node accounts are configured")
            }
            Refusal::NotNodeAccount(id) => {
                write!(f, "caller {id} is not a trusted node account")
            }
            Refusal::NoNode(id) => write!(
                f,
                "caller {id} has no pod binding or trusted node claim, so its node is unknown"
            ),
            Refusal::CallerPodNotFound { namespace, pod } => {
                write!(f, "caller pod {namespace}/{pod} is not in the index")
            }
            Refusal::CallerPodServiceAccount { pod, indexed } => write!(
                f,
                "caller pod {pod} runs as service account {indexed:?}, not the token's"
            ),
            Refusal::CallerPodUid {
                pod,
                token,
                indexed,
            } => write!(
                f,
                "caller pod {pod} has uid {indexed:?} but the token names {token:?}"
            ),
            Refusal::CallerNodeMismatch { claim, indexed } => write!(
                f,
                "token node claim {claim:?} differs from the caller pod's node {indexed:?}"
            ),
            Refusal::NoPodOnNode { identity, node } => {
                write!(
                    f,
                    "no pod with identity {identity} is scheduled on node {node:?}"
                )
            }
            Refusal::XdsNamespace { caller, proxy } => write!(
                f,
                "caller {caller} may not read xDS for a proxy in namespace {proxy:?}"
            ),
            Refusal::XdsServiceAccount { caller, proxy } => write!(
                f,
                "caller {caller} may not read xDS for a proxy with service account {proxy:?}"
            ),
        }
    }
}

/// The identity to put in the certificate, or why not.
///
/// `impersonate` is the `ImpersonatedIdentity` metadata value, if the request carried one.
pub fn authorize(
    policy: &Policy,
    caller: &Caller,
    impersonate: Option<&str>,
    pods: &dyn PodIndex,
) -> Result<SpiffeId, Refusal> {
    let Some(requested) = impersonate else {
        return Ok(caller.identity.clone());
    };
    let identity = SpiffeId::parse(requested)
        .filter(|id| id.trust_domain == policy.trust_domain)
        .ok_or_else(|| Refusal::BadImpersonatedIdentity(requested.to_string()))?;
    if policy.trusted_node_accounts.is_empty() {
        return Err(Refusal::NoTrustedNodeAccounts);
    }
    if !policy.is_node_account(&caller.identity) {
        return Err(Refusal::NotNodeAccount(caller.identity.clone()));
    }
    let node = caller_node(caller, pods)?;
    if !pods.identity_on_node(&node, &identity.namespace, &identity.service_account) {
        return Err(Refusal::NoPodOnNode { identity, node });
    }
    Ok(identity)
}

/// The node the caller runs on: from its pod in the index (checking the token's pod uid,
/// service account and node claim against it), or, for a local token whose pod is not indexed,
/// from its node claim.
pub fn caller_node(caller: &Caller, pods: &dyn PodIndex) -> Result<String, Refusal> {
    let trusted_claim = || match (&caller.node, caller.method) {
        (Some(node), Method::LocalToken) if !node.is_empty() => Some(node.clone()),
        _ => None,
    };
    let Some(binding) = &caller.pod else {
        return trusted_claim().ok_or_else(|| Refusal::NoNode(caller.identity.clone()));
    };
    let namespace = &caller.identity.namespace;
    let Some(pod) = pods.pod(namespace, &binding.name) else {
        return trusted_claim().ok_or_else(|| Refusal::CallerPodNotFound {
            namespace: namespace.clone(),
            pod: binding.name.clone(),
        });
    };
    let qualified = || format!("{namespace}/{}", binding.name);
    if pod.service_account != caller.identity.service_account {
        return Err(Refusal::CallerPodServiceAccount {
            pod: qualified(),
            indexed: pod.service_account,
        });
    }
    if let Some(indexed) = pod.uid.filter(|uid| !uid.is_empty())
        && binding.uid.as_deref() != Some(indexed.as_str())
    {
        return Err(Refusal::CallerPodUid {
            pod: qualified(),
            token: binding.uid.clone(),
            indexed,
        });
    }
    if pod.node.is_empty() {
        return Err(Refusal::NoNode(caller.identity.clone()));
    }
    if let Some(claim) = caller.node.as_ref().filter(|n| !n.is_empty())
        && *claim != pod.node
    {
        return Err(Refusal::CallerNodeMismatch {
            claim: claim.clone(),
            indexed: pod.node,
        });
    }
    Ok(pod.node)
}

/// What a proxy says about itself in its xDS node.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProxyClaim {
    /// `NAMESPACE` metadata, or the namespace in the node id's `<ns>.svc.<domain>` suffix.
    pub namespace: String,
    /// `SERVICE_ACCOUNT` metadata, when present.
    pub service_account: Option<String>,
}

/// istiod's xDS identity check: the caller's namespace must be the proxy's (and its service
/// account too, when the node names one).
pub fn check_xds_identity(caller: &SpiffeId, proxy: &ProxyClaim) -> Result<(), Refusal> {
    if proxy.namespace.is_empty() || proxy.namespace != caller.namespace {
        return Err(Refusal::XdsNamespace {
            caller: caller.clone(),
            proxy: proxy.namespace.clone(),
        });
    }
    if let Some(sa) = proxy.service_account.as_ref().filter(|s| !s.is_empty())
        && *sa != caller.service_account
    {
        return Err(Refusal::XdsServiceAccount {
            caller: caller.clone(),
            proxy: sa.clone(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ca::pods::{PodInfo, StaticPods};

    const TD: &str = "cluster.local";

    fn policy() -> Policy {
        Policy {
            trusted_node_accounts: vec![("istio-system".into(), "ztunnel".into())],
            trust_domain: TD.into(),
        }
    }

    fn pods() -> StaticPods {
        let mut pods = StaticPods::default();
        pods.insert(
            "istio-system",
            "ztunnel-a",
            PodInfo {
                service_account: "ztunnel".into(),
                node: "node-a".into(),
                uid: Some("uid-za".into()),
            },
        );
        pods.insert(
            "demo",
            "web-1",
            PodInfo {
                service_account: "web".into(),
                node: "node-a".into(),
                uid: Some("uid-w1".into()),
            },
        );
        pods.insert(
            "demo",
            "db-1",
            PodInfo {
                service_account: "db".into(),
                node: "node-b".into(),
                uid: None,
            },
        );
        pods
    }

    fn ztunnel(method: Method, pod: Option<(&str, Option<&str>)>, node: Option<&str>) -> Caller {
        Caller {
            identity: SpiffeId::new(TD, "istio-system", "ztunnel"),
            method,
            pod: pod.map(|(name, uid)| PodBinding {
                name: name.into(),
                uid: uid.map(Into::into),
            }),
            node: node.map(Into::into),
        }
    }

    const WEB: &str = "spiffe://cluster.local/ns/demo/sa/web";
    const DB: &str = "spiffe://cluster.local/ns/demo/sa/db";

    #[test]
    fn own_identity_without_impersonation() {
        let caller = ztunnel(Method::ServiceAccountToken, None, None);
        assert_eq!(
            authorize(&policy(), &caller, None, &pods()),
            Ok(caller.identity.clone())
        );
    }

    #[test]
    fn impersonation_matrix() {
        use Method::*;
        let bound = Some(("ztunnel-a", Some("uid-za")));
        let web = SpiffeId::parse(WEB).unwrap();
        let cases: Vec<(&str, Caller, &str, Result<SpiffeId, &str>)> = vec![
            (
                "pod-bound token, pod on node",
                ztunnel(ServiceAccountToken, bound, None),
                WEB,
                Ok(web.clone()),
            ),
            (
                "pod-bound token with agreeing node claim",
                ztunnel(ServiceAccountToken, bound, Some("node-a")),
                WEB,
                Ok(web.clone()),
            ),
            (
                "local token, node claim",
                ztunnel(LocalToken, Some(("ztunnel-local", None)), Some("node-a")),
                WEB,
                Ok(web.clone()),
            ),
            (
                "identity only on another node",
                ztunnel(ServiceAccountToken, bound, None),
                DB,
                Err("NoPodOnNode"),
            ),
            (
                "identity with no pod at all",
                ztunnel(ServiceAccountToken, bound, None),
                "spiffe://cluster.local/ns/demo/sa/ghost",
                Err("NoPodOnNode"),
            ),
            (
                "pod uid mismatch",
                ztunnel(
                    ServiceAccountToken,
                    Some(("ztunnel-a", Some("other"))),
                    None,
                ),
                WEB,
                Err("CallerPodUid"),
            ),
            (
                "pod uid missing from token",
                ztunnel(ServiceAccountToken, Some(("ztunnel-a", None)), None),
                WEB,
                Err("CallerPodUid"),
            ),
            (
                "local token whose pod is indexed with another uid",
                ztunnel(
                    LocalToken,
                    Some(("ztunnel-a", Some("other"))),
                    Some("node-a"),
                ),
                WEB,
                Err("CallerPodUid"),
            ),
            (
                "node claim disagrees with the index",
                ztunnel(ServiceAccountToken, bound, Some("node-b")),
                WEB,
                Err("CallerNodeMismatch"),
            ),
            (
                "unknown caller pod",
                ztunnel(ServiceAccountToken, Some(("ztunnel-x", Some("u"))), None),
                WEB,
                Err("CallerPodNotFound"),
            ),
            (
                "untrusted node claim alone",
                ztunnel(ServiceAccountToken, None, Some("node-a")),
                WEB,
                Err("NoNode"),
            ),
            (
                "client certificate has no node",
                ztunnel(ClientCertificate, None, None),
                WEB,
                Err("NoNode"),
            ),
            (
                "foreign trust domain",
                ztunnel(ServiceAccountToken, bound, None),
                "spiffe://other.td/ns/demo/sa/web",
                Err("BadImpersonatedIdentity"),
            ),
            (
                "not a spiffe id",
                ztunnel(ServiceAccountToken, bound, None),
                "web",
                Err("BadImpersonatedIdentity"),
            ),
        ];
        for (name, caller, requested, want) in cases {
            let got = authorize(&policy(), &caller, Some(requested), &pods());
            match (&got, want) {
                (Ok(id), Ok(want)) => assert_eq!(*id, want, "{name}"),
                (Err(refusal), Err(want)) => {
                    assert!(
                        format!("{refusal:?}").starts_with(want),
                        "{name}: {refusal:?}"
                    )
                }
                _ => panic!("{name}: got {got:?}"),
            }
        }
    }

    #[test]
    fn only_node_accounts_impersonate() {
        let mut caller = ztunnel(Method::LocalToken, None, Some("node-a"));
        caller.identity = SpiffeId::new(TD, "demo", "web");
        assert!(matches!(
            authorize(&policy(), &caller, Some(WEB), &pods()),
            Err(Refusal::NotNodeAccount(_))
        ));
        let none = Policy {
            trusted_node_accounts: vec![],
            trust_domain: TD.into(),
        };
        let caller = ztunnel(Method::LocalToken, None, Some("node-a"));
        assert_eq!(
            authorize(&none, &caller, Some(WEB), &pods()),
            Err(Refusal::NoTrustedNodeAccounts)
        );
    }

    #[test]
    fn a_pod_with_another_service_account_is_refused() {
        let mut caller = ztunnel(
            Method::ServiceAccountToken,
            Some(("web-1", Some("uid-w1"))),
            None,
        );
        caller.identity = SpiffeId::new(TD, "demo", "ztunnel");
        let policy = Policy {
            trusted_node_accounts: vec![("demo".into(), "ztunnel".into())],
            trust_domain: TD.into(),
        };
        assert!(matches!(
            authorize(&policy, &caller, Some(WEB), &pods()),
            Err(Refusal::CallerPodServiceAccount { .. })
        ));
    }

    #[test]
    fn trusted_accounts_parse() {
        assert_eq!(
            Policy::parse_accounts("istio-system/ztunnel, kube-system/ztunnel").unwrap(),
            vec![
                ("istio-system".to_string(), "ztunnel".to_string()),
                ("kube-system".to_string(), "ztunnel".to_string())
            ]
        );
        assert!(Policy::parse_accounts("").unwrap().is_empty());
        assert!(Policy::parse_accounts("ztunnel").is_err());
        assert!(Policy::parse_accounts("a/b/c").is_err());
    }

    #[test]
    fn xds_identity_check() {
        let caller = SpiffeId::new(TD, "istio-system", "ztunnel");
        let claim = |ns: &str, sa: Option<&str>| ProxyClaim {
            namespace: ns.into(),
            service_account: sa.map(Into::into),
        };
        assert_eq!(
            check_xds_identity(&caller, &claim("istio-system", None)),
            Ok(())
        );
        assert_eq!(
            check_xds_identity(&caller, &claim("istio-system", Some("ztunnel"))),
            Ok(())
        );
        assert!(check_xds_identity(&caller, &claim("demo", None)).is_err());
        assert!(check_xds_identity(&caller, &claim("", None)).is_err());
        assert!(check_xds_identity(&caller, &claim("istio-system", Some("other"))).is_err());
    }
}
