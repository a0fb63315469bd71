//! The bed: network namespaces, processes, the CNI agent's ZDS, the apps, and the mesh that
//! puts them together.

pub mod apps;
pub mod kube;
pub mod mesh;
pub mod netns;
pub mod objects;
pub mod process;
pub mod tools;
pub mod waypoint;
pub mod zds;
