//! The bed: network namespaces, processes, the CNI agent's ZDS, the apps, and the mesh that
//! puts them together.

pub mod apps;
pub mod mesh;
pub mod netns;
pub mod process;
pub mod tools;
pub mod zds;
