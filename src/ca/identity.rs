//! SPIFFE identities (`spiffe://<trust domain>/ns/<namespace>/sa/<service account>`), the only
//! form Istio issues and the only form ztunnel parses.

use std::fmt;

/// A workload identity: trust domain, namespace and service account.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SpiffeId {
    pub trust_domain: String,
    pub namespace: String,
    pub service_account: String,
}

impl SpiffeId {
    /// An identity from its three parts (not validated; see [`SpiffeId::parse`]).
    pub fn new(
        trust_domain: impl Into<String>,
        namespace: impl Into<String>,
        service_account: impl Into<String>,
    ) -> Self {
        SpiffeId {
            trust_domain: trust_domain.into(),
            namespace: namespace.into(),
            service_account: service_account.into(),
        }
    }

    /// Parses `spiffe://td/ns/X/sa/Y`; anything else (other paths, empty parts, query strings)
    /// is `None`, as in ztunnel.
    pub fn parse(uri: &str) -> Option<Self> {
        let rest = uri.strip_prefix("spiffe://")?;
        let mut parts = rest.split('/');
        let trust_domain = parts.next()?;
        let (ns, namespace, sa, service_account) =
            (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
        if parts.next().is_some() || ns != "ns" || sa != "sa" {
            return None;
        }
        let valid = |s: &str| {
            !s.is_empty()
                && s.chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_'))
        };
        if !(valid(trust_domain) && valid(namespace) && valid(service_account)) {
            return None;
        }
        Some(SpiffeId::new(trust_domain, namespace, service_account))
    }
}

impl fmt::Display for SpiffeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "spiffe://{}/ns/{}/sa/{}",
            self.trust_domain, self.namespace, self.service_account
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_rejects_other_shapes() {
        let id = SpiffeId::parse("spiffe://cluster.local/ns/demo/sa/web").unwrap();
        assert_eq!(id, SpiffeId::new("cluster.local", "demo", "web"));
        assert_eq!(id.to_string(), "spiffe://cluster.local/ns/demo/sa/web");
        for bad in [
            "spiffe://cluster.local/ns/demo/sa/",
            "spiffe://cluster.local/ns/demo/sa/web/extra",
            "spiffe://cluster.local/sa/web/ns/demo",
            "spiffe:///ns/demo/sa/web",
            "https://cluster.local/ns/demo/sa/web",
            "spiffe://cluster.local/ns/demo/sa/web?x=1",
            "",
        ] {
            assert_eq!(SpiffeId::parse(bad), None, "{bad}");
        }
    }
}
