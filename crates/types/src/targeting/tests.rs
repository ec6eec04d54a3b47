use super::*;

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn match_labels(pairs: &[(&str, &str)]) -> LabelSelector {
    LabelSelector {
        match_labels: Some(labels(pairs)),
        ..LabelSelector::default()
    }
}

fn expr(key: &str, op: &str, values: &[&str]) -> LabelSelectorRequirement {
    LabelSelectorRequirement {
        key: key.into(),
        operator: op.into(),
        values: (!values.is_empty()).then(|| values.iter().map(|v| v.to_string()).collect()),
    }
}

fn exprs(reqs: Vec<LabelSelectorRequirement>) -> LabelSelector {
    LabelSelector {
        match_expressions: Some(reqs),
        ..LabelSelector::default()
    }
}

struct World {
    clusters: Vec<(String, BTreeMap<String, String>)>,
    groups: Vec<(String, BTreeMap<String, String>, LabelSelector)>,
}

impl World {
    fn new() -> Self {
        Self {
            clusters: vec![
                (
                    "east".into(),
                    labels(&[("env", "prod"), ("region", "east")]),
                ),
                (
                    "west".into(),
                    labels(&[("env", "prod"), ("region", "west")]),
                ),
                ("dev".into(), labels(&[("env", "dev")])),
            ],
            groups: vec![
                (
                    "prod".into(),
                    labels(&[("tier", "gold")]),
                    match_labels(&[("env", "prod")]),
                ),
                (
                    "east".into(),
                    labels(&[("tier", "gold")]),
                    match_labels(&[("region", "east")]),
                ),
                ("all".into(), labels(&[]), LabelSelector::default()),
            ],
        }
    }

    fn run(&self, targets: Vec<BundleTarget>) -> Result<Vec<(String, usize)>, TargetingError> {
        let clusters: Vec<_> = self
            .clusters
            .iter()
            .map(|(name, labels)| ClusterInfo { name, labels })
            .collect();
        let groups: Vec<_> = self
            .groups
            .iter()
            .map(|(name, labels, selector)| GroupInfo {
                name,
                labels,
                selector,
            })
            .collect();
        let spec = BundleSpec {
            targets,
            ..BundleSpec::default()
        };
        Ok(match_targets(&spec, &clusters, &groups)?
            .into_iter()
            .map(|m| (m.cluster, m.target_index))
            .collect())
    }
}

fn names(result: &[(String, usize)]) -> Vec<&str> {
    result.iter().map(|(n, _)| n.as_str()).collect()
}

fn by_selector(selector: LabelSelector) -> BundleTarget {
    BundleTarget {
        cluster_selector: Some(selector),
        ..BundleTarget::default()
    }
}

fn by_group(group: &str) -> BundleTarget {
    BundleTarget {
        cluster_group: Some(group.into()),
        ..BundleTarget::default()
    }
}

#[test]
fn empty_selector_matches_every_cluster() {
    let got = World::new()
        .run(vec![by_selector(LabelSelector::default())])
        .unwrap();
    assert_eq!(names(&got), ["east", "west", "dev"]);
    assert!(selector_matches(&LabelSelector::default(), &labels(&[])).unwrap());
}

#[test]
fn target_without_criteria_matches_nothing() {
    assert!(
        World::new()
            .run(vec![BundleTarget::default()])
            .unwrap()
            .is_empty()
    );
    assert!(World::new().run(vec![]).unwrap().is_empty());
}

#[test]
fn cluster_name_selects_one() {
    let target = BundleTarget {
        cluster_name: Some("west".into()),
        ..BundleTarget::default()
    };
    assert_eq!(names(&World::new().run(vec![target]).unwrap()), ["west"]);
}

#[test]
fn match_labels_select_subset() {
    let got = World::new()
        .run(vec![by_selector(match_labels(&[("env", "prod")]))])
        .unwrap();
    assert_eq!(names(&got), ["east", "west"]);
}

#[test]
fn overlapping_targets_first_wins() {
    let got = World::new()
        .run(vec![
            by_selector(match_labels(&[("region", "east")])),
            by_selector(match_labels(&[("env", "prod")])),
            by_selector(LabelSelector::default()),
        ])
        .unwrap();
    assert_eq!(
        got,
        [
            ("east".to_string(), 0),
            ("west".to_string(), 1),
            ("dev".to_string(), 2)
        ]
    );
}

#[test]
fn cluster_in_several_groups_matched_once() {
    // east is in groups prod, east and all.
    let gold = BundleTarget {
        cluster_group_selector: Some(match_labels(&[("tier", "gold")])),
        ..BundleTarget::default()
    };
    let got = World::new().run(vec![gold, by_group("all")]).unwrap();
    assert_eq!(
        got,
        [
            ("east".to_string(), 0),
            ("west".to_string(), 0),
            ("dev".to_string(), 1)
        ]
    );
}

#[test]
fn empty_group_selector_selects_every_group() {
    let any_group = BundleTarget {
        cluster_group_selector: Some(LabelSelector::default()),
        ..BundleTarget::default()
    };
    assert_eq!(
        names(&World::new().run(vec![any_group]).unwrap()),
        ["east", "west", "dev"]
    );
}

fn target(v: serde_json::Value) -> BundleTarget {
    serde_json::from_value(v).unwrap()
}

#[test]
fn several_fields_must_all_hold() {
    let w = World::new();
    let got = w
        .run(vec![target(serde_json::json!({
            "clusterSelector": {"matchLabels": {"env": "prod"}},
            "clusterGroup": "east"
        }))])
        .unwrap();
    assert_eq!(names(&got), ["east"]);
    let got = w
        .run(vec![target(serde_json::json!({
            "clusterName": "west", "clusterSelector": {"matchLabels": {"env": "dev"}}
        }))])
        .unwrap();
    assert!(got.is_empty(), "name and selector disagree: nothing");
    let got = w
        .run(vec![target(serde_json::json!({
            "clusterName": "dev", "clusterGroupSelector": {}
        }))])
        .unwrap();
    assert_eq!(names(&got), ["dev"]);
}

#[test]
fn group_name_and_group_selector_hold_for_the_same_group() {
    // east is in prod (tier gold), east (tier gold) and all (no labels).
    let w = World::new();
    let same = w
        .run(vec![target(serde_json::json!({
            "clusterGroup": "east", "clusterGroupSelector": {"matchLabels": {"tier": "gold"}}
        }))])
        .unwrap();
    assert_eq!(names(&same), ["east"]);
    let different = w
        .run(vec![target(serde_json::json!({
            "clusterGroup": "all", "clusterGroupSelector": {"matchLabels": {"tier": "gold"}}
        }))])
        .unwrap();
    assert!(
        different.is_empty(),
        "group all has no tier label: Fleet matches per group, not per field"
    );
}

#[test]
fn a_cluster_in_no_group_is_judged_as_in_an_unnamed_unlabelled_one() {
    let w = World {
        groups: vec![(
            "prod".into(),
            labels(&[("tier", "gold")]),
            match_labels(&[("env", "prod")]),
        )],
        ..World::new()
    };
    let any = w
        .run(vec![target(
            serde_json::json!({"clusterGroupSelector": {}}),
        )])
        .unwrap();
    assert_eq!(names(&any), ["east", "west", "dev"], "Fleet's rule");
    let not_gold = w
        .run(vec![target(serde_json::json!({"clusterGroupSelector": {
            "matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["gold"]}]
        }}))])
        .unwrap();
    assert_eq!(names(&not_gold), ["dev"]);
    let gold = w
        .run(vec![target(
            serde_json::json!({"clusterGroupSelector": {"matchLabels": {"tier": "gold"}}}),
        )])
        .unwrap();
    assert_eq!(names(&gold), ["east", "west"]);
    assert_eq!(
        names(&w.run(vec![by_group("prod")]).unwrap()),
        ["east", "west"],
        "clusterGroup never selects a cluster in no group"
    );
}

#[test]
fn named_group_and_missing_group() {
    assert_eq!(
        names(&World::new().run(vec![by_group("prod")]).unwrap()),
        ["east", "west"]
    );
    assert!(
        World::new()
            .run(vec![by_group("missing")])
            .unwrap()
            .is_empty()
    );
}

#[test]
fn match_expressions() {
    let l = labels(&[("env", "prod"), ("region", "east")]);
    let check = |reqs| selector_matches(&exprs(reqs), &l).unwrap();
    assert!(check(vec![expr("env", "In", &["prod", "dev"])]));
    assert!(!check(vec![expr("env", "In", &["dev"])]));
    assert!(!check(vec![expr("missing", "In", &["x"])]));
    assert!(check(vec![expr("env", "NotIn", &["dev"])]));
    assert!(!check(vec![expr("env", "NotIn", &["prod"])]));
    assert!(check(vec![expr("missing", "NotIn", &["x"])]));
    assert!(check(vec![expr("region", "Exists", &[])]));
    assert!(!check(vec![expr("missing", "Exists", &[])]));
    assert!(check(vec![expr("missing", "DoesNotExist", &[])]));
    assert!(!check(vec![expr("env", "DoesNotExist", &[])]));
    // All requirements and matchLabels must hold.
    assert!(!check(vec![
        expr("env", "In", &["prod"]),
        expr("region", "In", &["west"])
    ]));
    let mut both = match_labels(&[("env", "prod")]);
    both.match_expressions = Some(vec![expr("region", "NotIn", &["east"])]);
    assert!(!selector_matches(&both, &l).unwrap());
}

#[test]
fn invalid_selectors_are_errors() {
    let l = labels(&[]);
    assert!(matches!(
        selector_matches(&exprs(vec![expr("a", "Equals", &["x"])]), &l),
        Err(SelectorError::InvalidOperator { .. })
    ));
    assert!(matches!(
        selector_matches(&exprs(vec![expr("a", "In", &[])]), &l),
        Err(SelectorError::MissingValues { .. })
    ));
    assert!(matches!(
        selector_matches(&exprs(vec![expr("a", "Exists", &["x"])]), &l),
        Err(SelectorError::UnexpectedValues { .. })
    ));
    let err = World::new()
        .run(vec![by_selector(exprs(vec![expr("a", "Bogus", &[])]))])
        .unwrap_err();
    assert!(err.to_string().starts_with("targets[0]: "), "{err}");
    assert!(err.to_string().contains("Bogus"), "{err}");
}

#[test]
fn invalid_group_selector_is_reported_with_group() {
    let mut world = World::new();
    world.groups.push((
        "broken".into(),
        labels(&[]),
        exprs(vec![expr("a", "Nope", &[])]),
    ));
    let err = world.run(vec![by_group("broken")]).unwrap_err();
    assert!(
        matches!(err, TargetingError::Group { ref group, .. } if group == "broken"),
        "{err}"
    );
}

#[test]
fn target_overrides_replace_bundle_options() {
    let spec = BundleSpec {
        default_namespace: Some("d".into()),
        target_namespace: Some("t".into()),
        keep_resources: false,
        downstream_resources: vec![DownstreamResource {
            api_version: None,
            kind: "Secret".into(),
            name: "a".into(),
        }],
        ..BundleSpec::default()
    };
    let plain = resolve_target(&spec, &BundleTarget::default());
    assert_eq!(plain.target_namespace.as_deref(), Some("t"));
    assert_eq!(plain.default_namespace.as_deref(), Some("d"));
    assert_eq!(plain.downstream_resources.len(), 1);
    assert!(!plain.keep_resources);

    let overriding = BundleTarget {
        target_namespace: Some("t2".into()),
        default_namespace: Some("d2".into()),
        downstream_resources: Some(vec![]),
        keep_resources: Some(true),
        ..BundleTarget::default()
    };
    let resolved = resolve_target(&spec, &overriding);
    assert_eq!(resolved.target_namespace.as_deref(), Some("t2"));
    assert_eq!(resolved.default_namespace.as_deref(), Some("d2"));
    assert!(resolved.downstream_resources.is_empty());
    assert!(resolved.keep_resources);
}

#[test]
fn fleets_namespace_is_target_namespace() {
    let fleet = |v: serde_json::Value| -> BundleSpec { serde_json::from_value(v).unwrap() };
    let spec = fleet(serde_json::json!({"namespace": "app", "targets": [
        {"clusterName": "a"},
        {"clusterName": "b", "namespace": "b-app"},
        {"clusterName": "c", "targetNamespace": "c-app"}
    ]}));
    let ns = |i: usize| resolve_target(&spec, &spec.targets[i]).target_namespace;
    assert_eq!(ns(0).as_deref(), Some("app"));
    assert_eq!(ns(1).as_deref(), Some("b-app"));
    assert_eq!(ns(2).as_deref(), Some("c-app"));
    let tender =
        fleet(serde_json::json!({"targetNamespace": "t", "targets": [{"clusterName": "a"}]}));
    assert_eq!(
        resolve_target(&tender, &tender.targets[0])
            .target_namespace
            .as_deref(),
        Some("t")
    );
}
