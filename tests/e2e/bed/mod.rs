//! The bed: network namespaces (`netns`), processes (`process`, `tools`), the CNI agent's ZDS
//! (`zds`), the apps (`apps`), and the mesh that puts them together (`mesh`: its types, the
//! control plane, objects and pods; `nodes`: nodes, ztunnels and the pods' network;
//! `waypoint`; `observe`: what the bed reads from the programs; `objects`: the Kubernetes
//! objects; `kube`: the API server).

pub mod apps;
pub mod kube;
pub mod mesh;
pub mod netns;
pub mod nodes;
pub mod objects;
pub mod observe;
pub mod process;
pub mod tools;
pub mod waypoint;
pub mod zds;
