use super::*;
use crate::helm::KeyRef;
use serde_json::json;

fn helm(v: Value) -> HelmOptions {
    serde_json::from_value(v).unwrap()
}

fn over(v: Value) -> HelmOverride {
    serde_json::from_value(v).unwrap()
}

fn secret(name: &str, key: &str) -> ValuesFrom {
    ValuesFrom {
        secret_key_ref: Some(KeyRef {
            name: name.into(),
            namespace: None,
            key: Some(key.into()),
        }),
        config_map_key_ref: None,
    }
}

#[test]
fn target_helm_merges_as_fleet_does() {
    let mut base = helm(json!({
        "chart": "app", "repo": "https://c", "version": "1.0.0",
        "values": {"image": {"repo": "r", "tag": "1"}, "list": [1, 2], "keep": true},
        "templateValues": {"a": "x", "b": "y"}
    }));
    base.values_from = vec![secret("s", "values.yaml"), secret("t", "values.yaml")];
    let mut o = over(json!({
        "version": "2.0.0",
        "values": {"image": {"tag": "2"}, "list": [9]},
        "templateValues": {"b": "z"},
        "takeOwnership": true
    }));
    o.values_from = vec![secret("t", "values.yaml"), secret("u", "values.yaml")];
    o.values_from[0].secret_key_ref.as_mut().unwrap().namespace = None;
    let m = merge_helm(&base, &o);
    assert_eq!(m.version.as_deref(), Some("2.0.0"));
    assert_eq!(m.chart, "app", "unset fields keep the Bundle's");
    assert_eq!(
        Value::Object(m.values.unwrap().0),
        json!({"image": {"repo": "r", "tag": "2"}, "list": [9], "keep": true})
    );
    assert_eq!(m.template_values["b"], "z");
    assert_eq!(m.template_values["a"], "x");
    let names: Vec<_> = m
        .values_from
        .iter()
        .map(|v| v.secret_key_ref.as_ref().unwrap().name.as_str())
        .collect();
    assert_eq!(
        names,
        ["s", "t", "u"],
        "same identity replaced in place, new appended"
    );
    assert!(m.take_ownership);
}

#[test]
fn merge_by_key_keeps_order_and_drops_repeats() {
    let key = |s: &&str| s.to_string();
    assert_eq!(
        merge_by_key(&["a", "b"], &["b", "c", "c"], key),
        ["a", "b", "c"]
    );
    assert_eq!(merge_by_key(&["a"], &[], key), ["a"]);
}

fn ctx() -> Value {
    let labels = BTreeMap::from([("env".to_string(), "prod".to_string())]);
    template::context(
        "east",
        "fleet-default",
        &labels,
        &BTreeMap::new(),
        json!({"replicas": 3}).as_object(),
    )
}

fn labels() -> BTreeMap<String, String> {
    BTreeMap::from([("env".to_string(), "prod".to_string())])
}

#[test]
fn values_are_templated_per_cluster() {
    let mut h = helm(json!({
        "chart": "app", "repo": "https://c",
        "values": {
            "name": "${ .ClusterName }-${ .ClusterLabels.env }",
            "replicas": "${ .ClusterValues.replicas }",
            "quoted": "${ .ClusterValues.replicas | quote }",
            "label": "global.fleet.clusterLabels.env",
            "absent": "global.fleet.clusterLabels.nope",
            "${ .ClusterLabels.env }-key": "v",
            "list": [{"x": "${ .ClusterNamespace }"}, "${ .ClusterName }"],
            "helm": "{{ .Values.untouched }}"
        },
        "templateValues": {"extra": "${ .ClusterLabels.env | upper }"}
    }));
    preprocess(&mut h, &labels(), &ctx()).unwrap();
    assert_eq!(
        Value::Object(h.values.unwrap().0),
        json!({
            "name": "east-prod", "replicas": 3, "quoted": "3", "label": "prod", "absent": "",
            "prod-key": "v", "list": [{"x": "fleet-default"}, "east"],
            "helm": "{{ .Values.untouched }}", "extra": "PROD"
        })
    );
    assert!(h.template_values.is_empty());
}

#[test]
fn disable_pre_process_keeps_templates_but_replaces_label_strings() {
    let mut h = helm(json!({
        "chart": "app", "repo": "https://c", "disablePreProcess": true,
        "values": {"t": "${ .ClusterName }", "l": "global.fleet.clusterLabels.env"}
    }));
    preprocess(&mut h, &labels(), &ctx()).unwrap();
    assert_eq!(
        Value::Object(h.values.unwrap().0),
        json!({"t": "${ .ClusterName }", "l": "prod"})
    );
}

#[test]
fn a_failing_template_names_its_path_not_the_values() {
    let mut h = helm(json!({
        "chart": "app", "repo": "https://c",
        "values": {"secretish": "hunter2", "app": {"tiers": [{"zone": "${ .ClusterLabels.zone }"}]}}
    }));
    let e = preprocess(&mut h, &labels(), &ctx()).unwrap_err();
    assert_eq!(e.path, "helm.values.app.tiers[0].zone");
    let text = e.to_string();
    assert!(text.contains("no entry for key \"zone\""), "{text}");
    assert!(
        !text.contains("hunter2") && !text.contains("prod"),
        "{text}"
    );

    let mut h =
        helm(json!({"chart": "a", "repo": "https://c", "templateValues": {"k": "${ bogus }"}}));
    let e = preprocess(&mut h, &labels(), &ctx()).unwrap_err();
    assert_eq!(e.path, "helm.templateValues.k");
}

#[test]
fn fleets_oci_form_normalises_to_tenders() {
    let h = helm(json!({"repo": "oci://reg.example/charts/app", "version": "1.0.0"})).normalized();
    assert_eq!(h.chart, "oci://reg.example/charts/app");
    assert!(h.repo.is_none() && h.is_oci());
    let h = helm(json!({"chart": "app", "repo": "https://c"})).normalized();
    assert_eq!(
        (h.chart.as_str(), h.repo.as_deref()),
        ("app", Some("https://c"))
    );
    // A target switching an HTTP chart to an oci:// one drops the Bundle's repo.
    let m = merge_helm(
        &helm(json!({"chart": "app", "repo": "https://c"})),
        &over(json!({"chart": "oci://r.example/x/app"})),
    )
    .normalized();
    assert_eq!(
        (m.chart.as_str(), m.repo.as_deref()),
        ("oci://r.example/x/app", None)
    );
}

#[test]
fn one_clusters_values_share_one_budget() {
    // 60 000 steps or so each: any one renders, forty of them are over one cluster's budget.
    let t = r#"${ range (splitList "," (repeat 10000 "a,")) }${ . }${ end }"#;
    let mut one = helm(json!({"chart": "app", "repo": "https://c", "values": {"v": t}}));
    preprocess(&mut one, &labels(), &ctx()).unwrap();
    let values: serde_json::Map<String, Value> =
        (0..40).map(|i| (format!("v{i:02}"), json!(t))).collect();
    let mut many = helm(json!({"chart": "app", "repo": "https://c", "values": values}));
    let e = preprocess(&mut many, &labels(), &ctx()).unwrap_err();
    assert!(e.path.starts_with("helm.values.v"), "{}", e.path);
    assert!(
        e.error.0.starts_with("template exceeded its budget of "),
        "{e}"
    );
}

#[test]
fn a_targets_absolute_chart_url_drops_the_bundles_repository() {
    let base = helm(json!({"chart": "app", "repo": "https://charts.example.com", "version": "^1"}));
    let over: HelmOverride =
        serde_json::from_value(json!({"chart": "https://mirror.example.com/app-1.2.0.tgz"}))
            .unwrap();
    let merged = merge_helm(&base, &over).normalized();
    assert_eq!(merged.chart, "https://mirror.example.com/app-1.2.0.tgz");
    assert_eq!(merged.repo, None, "the URL is the chart: no index to read");
    assert!(merged.is_url());
}

#[test]
fn ranges_make_lists_and_maps_of_values() {
    let mut h = helm(json!({
        "chart": "app", "repo": "https://c",
        "values": {
            "labels": "{${ range $k, $v := .ClusterLabels }${ $k }: ${ $v | quote }, ${ end }}",
            "zones": "[${ range $i, $z := list \"a\" \"b\" }${ if $i }, ${ end }${ $.ClusterName }-${ $z }${ end }]"
        },
        "templateValues": {"ids": "[${ range .ClusterValues.replicas }${ . },${ end }]"}
    }));
    preprocess(&mut h, &labels(), &ctx()).unwrap();
    assert_eq!(
        Value::Object(h.values.unwrap().0),
        json!({
            "labels": {"env": "prod"}, "zones": ["east-a", "east-b"], "ids": [0, 1, 2]
        })
    );
}
