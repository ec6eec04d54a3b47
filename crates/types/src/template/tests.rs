use super::*;
use serde_json::json;
use std::collections::BTreeMap;

fn ctx() -> Value {
    let labels = BTreeMap::from([
        ("env".to_string(), "prod".to_string()),
        (
            "management.cattle.io/cluster-display-name".to_string(),
            "east".to_string(),
        ),
    ]);
    let ann = BTreeMap::from([("team".to_string(), "web".to_string())]);
    let values = json!({"someValue": "abc", "replicas": 3, "nested": {"k": "v"}});
    context("c1", "fleet-default", &labels, &ann, values.as_object())
}

fn r(t: &str) -> String {
    render(t, &ctx()).unwrap()
}

fn e(t: &str) -> String {
    render(t, &ctx()).unwrap_err().0
}

#[test]
fn fleet_docs_examples_render() {
    assert_eq!(r("${ .ClusterLabels.env }-foo"), "prod-foo");
    assert_eq!(
        r("${ .ClusterValues.someValue | upper | quote }"),
        "\"ABC\""
    );
    assert_eq!(
        r(r#"${ get .ClusterLabels "management.cattle.io/cluster-display-name" }"#),
        "east"
    );
    assert_eq!(r("foo-bar-${`${PWD}`}"), "foo-bar-${PWD}");
    assert_eq!(
        r(
            r#"${ if hasKey .ClusterLabels "LABELNAME" }${ .ClusterLabels.LABELNAME }${ else }missing${ end}"#
        ),
        "missing"
    );
    assert_eq!(
        r("${ .ClusterName }/${ .ClusterNamespace }"),
        "c1/fleet-default"
    );
    assert_eq!(r("${ .ClusterValues.replicas }"), "3");
    assert_eq!(r("${ .ClusterAnnotations.team }"), "web");
}

#[test]
fn functions_pipelines_and_blocks() {
    assert_eq!(
        r(r#"${ get .ClusterLabels "region" | default "eu" }"#),
        "eu"
    );
    assert_eq!(r(r#"${ index .ClusterLabels "env" }"#), "prod");
    assert_eq!(r(r#"${ replace "o" "0" .ClusterLabels.env }"#), "pr0d");
    assert_eq!(
        r(
            r#"${ if eq .ClusterLabels.env "prod" }3${ else if eq .ClusterLabels.env "dev" }1${ else }2${ end }"#
        ),
        "3"
    );
    assert_eq!(r("${ with .ClusterValues.nested }${ .k }${ end }"), "v");
    assert_eq!(r("${ range .ClusterValues.nested }[${ . }]${ end }"), "[v]");
    assert_eq!(r(r#"${ printf "%s-%d" .ClusterName 7 }"#), "c1-7");
    assert_eq!(r("a ${- /* note */ -} b"), "ab");
    assert_eq!(
        r("${ (.ClusterLabels.env | upper) | lower | trunc 3 }"),
        "pro"
    );
    assert_eq!(r("${ $.ClusterName }"), "c1");
    assert_eq!(r("${ .ClusterValues.nested | toJson }"), r#"{"k":"v"}"#);
}

#[test]
fn failures_name_the_construct_not_the_values() {
    let m = e("${ .ClusterLabels.region }");
    assert!(
        m.contains("no entry for key \"region\" at .ClusterLabels.region"),
        "{m}"
    );
    assert!(e("${ env \"HOME\" }").contains("function \"env\" not defined"));
    assert!(e("${ expandenv \"$HOME\" }").contains("not defined"));
    assert!(e("${ .ClusterName ").contains("unclosed action"));
    assert!(e("${ if .ClusterName }x").contains("end"));
    assert!(e("${ end }").contains("unexpected end"));
    let secret = e(r#"${ index .ClusterValues.someValue "x" }"#);
    assert!(!secret.contains("abc"), "{secret}");
}

#[test]
fn text_without_actions_is_unchanged() {
    assert_eq!(
        r("plain {{ .Values.x }} text"),
        "plain {{ .Values.x }} text"
    );
    assert!(!has_actions("{{ helm }}"));
}

#[test]
fn every_listed_function_is_implemented() {
    for f in funcs::NAMES {
        let e = funcs::call(f, Vec::new());
        assert!(
            !e.is_err_and(|e| e.0.ends_with("not defined")),
            "{f} is listed but not implemented"
        );
    }
    assert_eq!(
        r(r#"${ list "a" "a" "b" | uniq | toJson }"#),
        r#"["a","b"]"#
    );
}

#[test]
fn output_is_bounded() {
    assert!(e(r#"${ repeat 10000 (repeat 10000 "x") }"#).contains("larger than 1 MiB"));
    let big = r#"${ range (splitList "," (repeat 9999 "a,")) }${ repeat 200 "y" }${ end }"#;
    assert!(e(big).contains("larger than 1 MiB"));
}
