//! The scenarios, one module each.

mod dns;
mod figures;
mod kube;
mod l4;
mod lifecycle;
mod on_demand;
mod restart;
mod waypoint;

use std::net::Ipv4Addr;

use crate::bed::apps::Protocol;
use crate::bed::mesh::{Mesh, PodSpec};

/// The pair most scenarios start from: `a` on node 1, and `b` on node 2 running `servers`
/// behind Service `b` with `ports` (name, port, targetPort). Returns b's VIP once every
/// ztunnel knows it.
pub fn a_and_b(
    mesh: &mut Mesh,
    servers: &[(Protocol, u16)],
    ports: &[(&str, u16, u16)],
) -> Ipv4Addr {
    mesh.add_pod(PodSpec::new("a", 1));
    mesh.add_pod(PodSpec::new("b", 2));
    for (protocol, port) in servers {
        mesh.serve("b", *protocol, *port);
    }
    let vip = mesh.add_service("b", &[("app", "b")], ports, &[]);
    mesh.wait_ztunnels_know(&vip.to_string());
    vip
}
