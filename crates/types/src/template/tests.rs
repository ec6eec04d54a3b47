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
        let e = funcs::call(f, Vec::new(), &mut Budget::default());
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

/// The hostile Helm value of issue 36: `range` five deep over 1 001 entries each.
fn bomb(depth: usize) -> String {
    let open = r#"${ range (splitList "," (repeat 1000 "a,")) }"#;
    format!("{}x{}", open.repeat(depth), "${ end }".repeat(depth))
}

#[test]
fn nested_ranges_are_refused_by_steps_quickly() {
    let started = std::time::Instant::now();
    // A generous clock, so the step count is what refuses it.
    let mut budget = Budget::new(MAX_STEPS, std::time::Duration::from_secs(60));
    let m = render_within(&bomb(5), &ctx(), &mut budget).unwrap_err().0;
    let took = started.elapsed();
    assert_eq!(
        m,
        format!("template exceeded its budget of {MAX_STEPS} steps")
    );
    // Refused at the call that went over (a call pays for its result at once).
    assert!(budget.steps() <= MAX_STEPS + 2_000, "{}", budget.steps());
    eprintln!("the bomb was refused after {took:?}");
    // Unoptimised test builds included: the budget is a few milliseconds' work, not hours'.
    assert!(took < std::time::Duration::from_secs(5), "{took:?}");
}

#[test]
fn the_clock_refuses_what_the_steps_allow() {
    let mut budget = Budget::new(u64::MAX, std::time::Duration::from_millis(20));
    let started = std::time::Instant::now();
    let m = render_within(&bomb(5), &ctx(), &mut budget).unwrap_err().0;
    assert_eq!(m, "template exceeded its budget of 20 ms");
    assert!(started.elapsed() < std::time::Duration::from_secs(1));
    // The default budget refuses it too, by whichever comes first.
    let m = e(&bomb(5));
    assert!(m.starts_with("template exceeded its budget of "), "{m}");
}

#[test]
fn budget_errors_quote_no_value() {
    let labels = BTreeMap::from([("env".to_string(), "s3cr3t-label".to_string())]);
    let values = json!({"token": "s3cr3t,"});
    let ctx = context("c1", "ws", &labels, &BTreeMap::new(), values.as_object());
    let t = format!(
        "${{ .ClusterValues.token }}${{ .ClusterLabels.env }}{}",
        bomb(5).replace("\"a,\"", "$.ClusterValues.token")
    );
    let m = render(&t, &ctx).unwrap_err().0;
    assert!(m.starts_with("template exceeded its budget of "), "{m}");
    assert!(!m.contains("s3cr3t") && !m.contains("a,"), "{m}");
}

#[test]
fn ordinary_templates_take_few_steps() {
    let mut budget = Budget::default();
    let t = r#"${ range (splitList "," (repeat 1000 "a,")) }${ if eq . "a" }${ upper . }${ end }${ end }"#;
    let out = render_within(t, &ctx(), &mut budget).unwrap();
    assert_eq!(out, "A".repeat(1000));
    assert!(budget.steps() < MAX_STEPS / 50, "{}", budget.steps());
}

#[test]
fn one_call_is_bounded_before_it_allocates() {
    // 1 MiB inserted between each of a million characters: refused, not allocated.
    let m = e(r#"${ replace "" (repeat 1000 (repeat 1000 "y")) (repeat 1000 (repeat 1000 "x")) }"#);
    assert!(m.contains("larger than 1 MiB"), "{m}");
    let m = e(r#"${ join (repeat 1000 (repeat 1000 "y")) (splitList "" (repeat 1000 "ab")) }"#);
    assert!(m.contains("larger than 1 MiB"), "{m}");
    // A million one-byte pieces are a million values: over the budget before the list is made.
    let m = e(r#"${ len (splitList "" (repeat 1000 (repeat 1000 "x"))) }"#);
    assert!(m.contains("budget of"), "{m}");
}

#[test]
fn parsing_depth_is_bounded() {
    let deep = "${ if 1 }".repeat(100_000);
    assert!(e(&deep).contains("nested too deeply"));
    let parens = format!("${{ {}1{} }}", "(".repeat(100_000), ")".repeat(100_000));
    assert!(e(&parens).contains("nested too deeply"));
}
