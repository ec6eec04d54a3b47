//! Fleet's per-target `helm`, values templating and `doNotDeploy` in the Bundle plan.

use super::*;
use serde_json::json;

fn spec(v: serde_json::Value) -> BundleSpec {
    serde_json::from_value(v).unwrap()
}

fn views<'a>(
    clusters: &'a [(String, BTreeMap<String, String>)],
    none: &'a BTreeMap<String, String>,
) -> Vec<ClusterView<'a>> {
    clusters
        .iter()
        .map(|(name, labels)| ClusterView {
            name,
            labels,
            namespace: Some(name.as_str()),
            paused: false,
            workspace: "ws",
            annotations: none,
            template_values: None,
        })
        .collect()
}

fn clusters() -> Vec<(String, BTreeMap<String, String>)> {
    ["prod", "dev", "test"]
        .iter()
        .map(|env| {
            (
                format!("c-{env}"),
                BTreeMap::from([("env".to_string(), env.to_string())]),
            )
        })
        .collect()
}

fn run(s: &BundleSpec) -> Plan {
    let none = BTreeMap::new();
    let c = clusters();
    plan(
        "web",
        s,
        &views(&c, &none),
        &[],
        &BTreeMap::new(),
        &Copying::defaults(true),
    )
    .unwrap()
}

fn values(p: &Plan, cluster: &str) -> serde_json::Value {
    let d = p.deployments.iter().find(|d| d.cluster == cluster).unwrap();
    let h = p.spec(d).unwrap().helm.unwrap();
    serde_json::Value::Object(h.values.unwrap().0)
}

#[test]
fn each_cluster_gets_its_targets_values_templated_with_its_labels() {
    let s = spec(json!({
        "helm": {"chart": "app", "repo": "https://c", "values": {"env": "${ .ClusterLabels.env }", "replicas": 1}},
        "targets": [
            {"clusterSelector": {"matchLabels": {"env": "prod"}}, "helm": {"values": {"replicas": 3}, "version": "2.0.0"}},
            {"clusterSelector": {"matchLabels": {"env": "test"}}, "doNotDeploy": true},
            {"clusterSelector": {}}
        ]
    }));
    let p = run(&s);
    assert_eq!(
        p.matched,
        ["c-prod", "c-dev"],
        "doNotDeploy keeps c-test out"
    );
    assert_eq!(values(&p, "c-prod"), json!({"env": "prod", "replicas": 3}));
    assert_eq!(values(&p, "c-dev"), json!({"env": "dev", "replicas": 1}));
    let prod = p
        .deployments
        .iter()
        .find(|d| d.cluster == "c-prod")
        .unwrap();
    assert_eq!(
        p.spec(prod).unwrap().helm.unwrap().version.as_deref(),
        Some("2.0.0")
    );
    let ids: BTreeSet<_> = p
        .deployments
        .iter()
        .map(|d| d.spec.as_ref().unwrap().deployment_id.clone())
        .collect();
    assert_eq!(ids.len(), 2, "different values, different deploymentIDs");
}

#[test]
fn a_bundle_without_templates_shares_its_chart() {
    let s = spec(json!({
        "helm": {"repo": "oci://reg.example/charts/app", "values": {"a": 1}},
        "targets": [{"clusterSelector": {}}]
    }));
    let p = run(&s);
    assert!(
        p.deployments
            .iter()
            .all(|d| d.spec.as_ref().unwrap().helm.is_none())
    );
    let h = p.helm.as_ref().unwrap();
    assert_eq!(
        h.chart, "oci://reg.example/charts/app",
        "Fleet's OCI form normalised"
    );
    assert!(h.repo.is_none());
}

#[test]
fn a_failing_template_blocks_only_its_cluster() {
    let s = spec(json!({
        "helm": {"chart": "app", "repo": "https://c", "values": {"zone": "${ .ClusterLabels.zone }"}},
        "targets": [
            {"clusterName": "c-prod", "helm": {"values": {"zone": "eu"}}},
            {"clusterSelector": {}}
        ]
    }));
    let p = run(&s);
    assert_eq!(values(&p, "c-prod"), json!({"zone": "eu"}));
    let blocked: Vec<_> = p
        .deployments
        .iter()
        .filter(|d| d.spec.is_none())
        .map(|d| d.cluster.as_str())
        .collect();
    assert_eq!(blocked, ["c-dev", "c-test"]);
    assert_eq!(p.template_failed.len(), 2);
    assert!(
        p.template_failed[0]
            .starts_with("c-dev: helm.values.zone: map has no entry for key \"zone\""),
        "{:?}",
        p.template_failed
    );
}

#[test]
fn namespace_labels_merge_per_target() {
    let s = spec(json!({
        "resources": [{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "m"}}],
        "namespaceLabels": {"team": "web", "tier": "1"},
        "namespaceAnnotations": {"owner": "a"},
        "targets": [
            {"clusterName": "c-prod", "namespaceLabels": {"tier": "0"}},
            {"clusterSelector": {}}
        ]
    }));
    let p = run(&s);
    let opts = |c: &str| {
        p.deployments
            .iter()
            .find(|d| d.cluster == c)
            .unwrap()
            .spec
            .as_ref()
            .unwrap()
            .options
            .clone()
    };
    assert_eq!(opts("c-prod").namespace_labels["tier"], "0");
    assert_eq!(opts("c-prod").namespace_labels["team"], "web");
    assert_eq!(opts("c-dev").namespace_labels["tier"], "1");
    assert_eq!(opts("c-dev").namespace_annotations["owner"], "a");
}

#[test]
fn a_template_over_its_budget_blocks_its_cluster_naming_the_budget() {
    // Issue 36: `range` five deep over 1 001 entries, a cluster's template run for hours.
    let open = r#"${ range (splitList "," (repeat 1000 "a,")) }"#;
    let bomb = format!("{}x{}", open.repeat(5), "${ end }".repeat(5));
    let s = spec(json!({
        "helm": {"chart": "app", "repo": "https://c", "values": {"bomb": bomb, "env": "${ .ClusterLabels.env }"}},
        "targets": [
            {"clusterName": "c-prod", "helm": {"values": {"bomb": "defused"}}},
            {"clusterSelector": {}}
        ]
    }));
    let p = run(&s);
    assert_eq!(
        values(&p, "c-prod"),
        json!({"bomb": "defused", "env": "prod"})
    );
    assert_eq!(p.template_failed.len(), 2, "{:?}", p.template_failed);
    for (f, cluster) in p.template_failed.iter().zip(["c-dev", "c-test"]) {
        let prefix = format!("{cluster}: helm.values.bomb: template exceeded its budget of ");
        assert!(f.starts_with(&prefix), "{f}");
        assert!(!f.contains("a,"), "{f}");
    }
}
