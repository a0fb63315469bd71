//! A `security.istio.io` PeerAuthentication, reduced to what ambient reads. Conversion is
//! `convert::peer_authentication`.

use std::cmp::Ordering;
use std::collections::BTreeMap;

use crate::discovery::model::labels::Labels;

/// An mTLS mode, top-level or per port.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum MtlsMode {
    /// Inherit from the parent (namespace, then mesh).
    #[default]
    Unset,
    Permissive,
    Strict,
    Disable,
}

impl MtlsMode {
    pub(crate) fn non_strict(self) -> bool {
        matches!(self, MtlsMode::Permissive | MtlsMode::Disable)
    }
}

/// A `security.istio.io` PeerAuthentication, reduced to what ambient reads.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PeerAuthentication {
    pub name: String,
    pub namespace: String,
    /// The `istio.io/rev` label, if any.
    pub revision: Option<String>,
    /// `spec.selector.matchLabels`: `None` without a `selector` field, `Some` (maybe empty)
    /// with one.
    pub selector: Option<Labels>,
    /// `spec.mtls.mode`.
    pub mode: MtlsMode,
    /// `spec.portLevelMtls`, by port number.
    pub port_level: BTreeMap<u32, MtlsMode>,
    /// `metadata.creationTimestamp` as written (RFC 3339, UTC). `None` sorts as oldest, as
    /// Go's zero time does.
    pub creation: Option<String>,
}

impl PeerAuthentication {
    /// "Oldest wins": creation timestamp, then name (istiod keeps the first of equal times, and
    /// lists objects by name).
    pub(crate) fn age_order(&self, other: &Self) -> Ordering {
        (&self.creation, &self.namespace, &self.name).cmp(&(
            &other.creation,
            &other.namespace,
            &other.name,
        ))
    }
}
