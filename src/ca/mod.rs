//! The embedded CA (`istio.v1.auth.IstioCertificateService`): authorizer, signer, roots and
//! the gRPC edge. Not built yet; the wire types live in [`crate::pb::istio::v1::auth`].
