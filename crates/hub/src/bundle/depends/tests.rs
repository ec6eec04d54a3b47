use super::*;
use crate::bundle::plan::{DesiredDeployment, DesiredSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use tender_types::BundleDeploymentOptions;

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn by_name(name: &str) -> BundleRef {
    BundleRef {
        name: Some(name.into()),
        ..Default::default()
    }
}

fn by_selector(pairs: &[(&str, &str)]) -> BundleRef {
    BundleRef {
        selector: Some(LabelSelector {
            match_labels: Some(labels(pairs)),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn plan_for(clusters: &[&str]) -> Plan {
    Plan {
        deployments: clusters
            .iter()
            .map(|c| DesiredDeployment {
                cluster: c.to_string(),
                namespace: format!("ns-{c}"),
                spec: Some(DesiredSpec {
                    deployment_id: "id".into(),
                    paused: false,
                    options: BundleDeploymentOptions::default(),
                    helm: None,
                }),
                copies: Vec::new(),
            })
            .collect(),
        ..Default::default()
    }
}

fn held_clusters(plan: &Plan) -> Vec<&str> {
    plan.deployments
        .iter()
        .filter(|d| d.spec.is_none())
        .map(|d| d.cluster.as_str())
        .collect()
}

#[test]
fn names_and_selectors_resolve_within_the_workspace_never_to_self_by_selector() {
    let db = labels(&[("tier", "db")]);
    let none = BTreeMap::new();
    let b_deps = vec![by_name("a"), by_selector(&[("tier", "db")])];
    let ws = [
        Node {
            name: "a",
            labels: &none,
            depends_on: &[],
        },
        Node {
            name: "pg",
            labels: &db,
            depends_on: &[],
        },
        // `b` itself carries tier=db: its own selector does not select it.
        Node {
            name: "b",
            labels: &db,
            depends_on: &b_deps,
        },
    ];
    let Resolution::Resolved(deps) = resolve("b", &b_deps, &ws) else {
        panic!("resolved")
    };
    let names: Vec<Vec<String>> = deps.into_iter().map(|(_, n)| n).collect();
    assert_eq!(names, vec![vec!["a".to_string()], vec!["pg".to_string()]]);
}

#[test]
fn a_missing_dependency_and_a_cycle_are_named() {
    let none = BTreeMap::new();
    let b_deps = vec![by_name("a"), by_name("ghost")];
    let ws = [Node {
        name: "a",
        labels: &none,
        depends_on: &[],
    }];
    assert_eq!(
        resolve("b", &b_deps, &ws),
        Resolution::NotFound(vec!["name ghost".into()])
    );
    // b -> a -> c -> b
    let b_deps = vec![by_name("a")];
    let a_deps = vec![by_name("c")];
    let c_deps = vec![by_name("b")];
    let ws = [
        Node {
            name: "a",
            labels: &none,
            depends_on: &a_deps,
        },
        Node {
            name: "b",
            labels: &none,
            depends_on: &b_deps,
        },
        Node {
            name: "c",
            labels: &none,
            depends_on: &c_deps,
        },
    ];
    assert_eq!(
        resolve("b", &b_deps, &ws),
        Resolution::Cycle(vec!["b".into(), "a".into(), "c".into(), "b".into()])
    );
    // Depending on a cycle one is not part of is no cycle of one's own: just waiting.
    let d_deps = vec![by_name("a")];
    assert!(matches!(
        resolve("d", &d_deps, &ws),
        Resolution::Resolved(_)
    ));
    // Oneself by name.
    let self_deps = vec![by_name("b")];
    let ws = [Node {
        name: "b",
        labels: &none,
        depends_on: &self_deps,
    }];
    assert_eq!(
        resolve("b", &self_deps, &ws),
        Resolution::Cycle(vec!["b".into(), "b".into()])
    );
}

#[test]
fn clusters_are_held_until_each_dependency_is_accepted_there() {
    let mut plan = plan_for(&["one", "two", "three"]);
    let resolution = Resolution::Resolved(vec![(by_name("a"), vec!["a".into()])]);
    let g = super::gate(&mut plan, &resolution, |dep, ns| {
        assert_eq!(dep, "a");
        match ns {
            "ns-one" => Some(BundleState::Ready),
            "ns-two" => Some(BundleState::NotReady),
            _ => None,
        }
    });
    assert_eq!(held_clusters(&plan), vec!["two", "three"]);
    assert_eq!(
        g.held,
        vec![
            ("three".to_string(), "a: not deployed there".to_string()),
            ("two".to_string(), "a: NotReady".to_string()),
        ]
    );
    assert!(g.error.is_none());

    // acceptedStates widens what counts.
    let mut plan = plan_for(&["two"]);
    let mut entry = by_name("a");
    entry.accepted_states = vec![BundleState::Ready, BundleState::NotReady];
    let resolution = Resolution::Resolved(vec![(entry, vec!["a".into()])]);
    let g = super::gate(&mut plan, &resolution, |_, _| Some(BundleState::NotReady));
    assert!(g.held.is_empty());
    assert!(held_clusters(&plan).is_empty());
}

#[test]
fn an_unresolvable_bundle_holds_every_cluster_with_its_reason() {
    let mut plan = plan_for(&["one", "two"]);
    let g = super::gate(
        &mut plan,
        &Resolution::Cycle(vec!["b".into(), "a".into(), "b".into()]),
        |_, _| Some(BundleState::Ready),
    );
    assert_eq!(held_clusters(&plan), vec!["one", "two"]);
    let (why, message) = g.error.unwrap();
    assert_eq!(why, reason::DEPENDENCY_CYCLE);
    assert!(message.contains("b -> a -> b"), "{message}");
    let mut plan = plan_for(&["one"]);
    let g = super::gate(
        &mut plan,
        &Resolution::NotFound(vec!["name ghost".into()]),
        |_, _| Some(BundleState::Ready),
    );
    assert_eq!(g.error.unwrap().0, reason::DEPENDENCY_NOT_FOUND);
    assert_eq!(held_clusters(&plan), vec!["one"]);
}

#[test]
fn no_dependencies_hold_nothing() {
    let mut plan = plan_for(&["one"]);
    let before = plan.clone();
    let g = super::gate(&mut plan, &resolve("b", &[], &[]), |_, _| None);
    assert_eq!(g, Gate::default());
    assert_eq!(plan, before);
}

#[test]
fn only_bundles_that_may_depend_on_a_change_are_woken() {
    let spec = BundleSpec {
        depends_on: vec![by_name("a")],
        ..Default::default()
    };
    assert!(may_depend_on(&spec, "a", None));
    assert!(!may_depend_on(&spec, "x", None));
    let spec = BundleSpec {
        depends_on: vec![by_selector(&[("tier", "db")])],
        ..Default::default()
    };
    assert!(may_depend_on(&spec, "pg", Some(&labels(&[("tier", "db")]))));
    assert!(!may_depend_on(
        &spec,
        "web",
        Some(&labels(&[("tier", "web")]))
    ));
    // Labels unknown (the Bundle is gone): maybe.
    assert!(may_depend_on(&spec, "pg", None));
    assert!(!may_depend_on(&BundleSpec::default(), "a", None));
}

#[test]
fn the_held_message_is_bounded() {
    let held: Vec<(String, String)> = (0..8)
        .map(|i| (format!("c{i}"), "a: NotReady".to_string()))
        .collect();
    let m = held_message(&held);
    assert!(m.starts_with("8 clusters wait"), "{m}");
    assert!(m.ends_with("and 3 more"), "{m}");
}
