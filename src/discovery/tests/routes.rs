//! HTTPRoutes and GRPCRoutes in the index: stored, published in the snapshot as one shared
//! slice that changes (by pointer) only when a route does, never built into a ztunnel
//! resource, and relisted like every kind.

use std::sync::Arc;

use super::support::*;
use crate::discovery::model::{Kind, ObjectRef, ParentRef, Route, RouteKind};
use crate::discovery::{Index, Object, Settings};

fn route(kind: RouteKind, name: &str, service: &str) -> Route {
    Route {
        kind,
        name: name.into(),
        namespace: NS.into(),
        parent_refs: vec![ParentRef {
            kind: "Service".into(),
            name: service.into(),
            ..Default::default()
        }],
        ..Default::default()
    }
}

fn http(name: &str, service: &str) -> Object {
    Object::HttpRoute(route(RouteKind::Http, name, service))
}

fn grpc(name: &str, service: &str) -> Object {
    Object::GrpcRoute(route(RouteKind::Grpc, name, service))
}

fn names(index: &mut Index) -> Vec<(RouteKind, String)> {
    index
        .snapshot()
        .routes
        .iter()
        .map(|r| (r.kind, r.name.clone()))
        .collect()
}

#[test]
fn routes_are_published_sorted_and_build_no_resource() {
    let mut index = Index::new(Settings::default());
    index.apply(Object::Namespace(ns(NS)));
    let empty = index.snapshot();
    assert!(empty.routes.is_empty());
    for object in [grpc("g", "web"), http("b", "web"), http("a", "api")] {
        let changes = index.apply(object);
        assert!(changes.is_empty(), "a route builds nothing for ztunnel");
        assert!(index.has_unpublished(), "yet the snapshot must carry it");
    }
    assert_eq!(
        names(&mut index),
        [
            (RouteKind::Http, "a".to_string()),
            (RouteKind::Http, "b".to_string()),
            (RouteKind::Grpc, "g".to_string()),
        ]
    );
    assert!(!index.has_unpublished());
}

#[test]
fn the_slice_changes_only_when_a_route_does() {
    let mut index = Index::new(Settings::default());
    index.apply(Object::Namespace(ns(NS)));
    index.apply(http("a", "web"));
    let first = index.snapshot();
    // Another kind: the same slice.
    index.apply(Object::Pod(pod(NS, "p", "10.0.0.1").into()));
    let second = index.snapshot();
    assert!(Arc::ptr_eq(&first.routes, &second.routes));
    // The same route again: nothing to publish, the same slice.
    index.apply(http("a", "web"));
    assert!(!index.has_unpublished());
    assert!(Arc::ptr_eq(&second.routes, &index.snapshot().routes));
    // A changed route: a new slice; the unchanged routes' objects are shared.
    index.apply(http("b", "web"));
    let third = index.snapshot();
    assert!(!Arc::ptr_eq(&second.routes, &third.routes));
    assert!(Arc::ptr_eq(&second.routes[0], &third.routes[0]));
    let mut changed = route(RouteKind::Http, "b", "api");
    changed.generation = 2;
    index.apply(Object::HttpRoute(changed));
    let fourth = index.snapshot();
    assert_eq!(fourth.routes[1].parent_refs[0].name, "api");
    // Deleted.
    index.delete(&ObjectRef::new(Kind::HttpRoute, NS, "a"));
    assert_eq!(names(&mut index), [(RouteKind::Http, "b".to_string())]);
    // An HTTPRoute and a GRPCRoute may share a name.
    index.apply(grpc("b", "web"));
    assert_eq!(
        names(&mut index),
        [
            (RouteKind::Http, "b".to_string()),
            (RouteKind::Grpc, "b".to_string())
        ]
    );
    index.delete(&ObjectRef::new(Kind::GrpcRoute, NS, "b"));
    assert_eq!(names(&mut index), [(RouteKind::Http, "b".to_string())]);
}

#[test]
fn a_relist_replaces_the_routes_of_its_kind() {
    let mut index = Index::new(Settings::default());
    for object in [http("a", "web"), http("b", "web"), grpc("g", "web")] {
        index.apply(object);
    }
    index.snapshot();
    index.reset(Kind::HttpRoute, vec![http("c", "web")]);
    assert_eq!(
        names(&mut index),
        [
            (RouteKind::Http, "c".to_string()),
            (RouteKind::Grpc, "g".to_string())
        ]
    );
    index.reset(Kind::GrpcRoute, Vec::new());
    assert_eq!(names(&mut index), [(RouteKind::Http, "c".to_string())]);
}
