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
fn nested_ranges_are_refused_by_steps() {
    // A generous clock, so the step count is what refuses it.
    let mut budget = Budget::new(MAX_STEPS, std::time::Duration::from_secs(60));
    let m = render_within(&bomb(5), &ctx(), &mut budget).unwrap_err().0;
    assert_eq!(
        m,
        format!("template exceeded its budget of {MAX_STEPS} steps")
    );
    // Refused at the call that went over (a call pays for its result at once): the work done
    // is bounded by the step count, whatever the machine's speed (no wall-clock assertion).
    assert!(budget.steps() <= MAX_STEPS + 2_000, "{}", budget.steps());
}

#[test]
fn the_clock_refuses_what_the_steps_allow() {
    let mut budget = Budget::new(u64::MAX, std::time::Duration::from_millis(20));
    let m = render_within(&bomb(5), &ctx(), &mut budget).unwrap_err().0;
    assert_eq!(m, "template exceeded its budget of 20 ms");
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

/// `range` and `with` with variables, `else`, `break` and `continue`, over lists, maps and
/// integers. Each expected text is what Go's `text/template` printed for the same template
/// with `{{ }}` delimiters (helm v3.22, go1.26, `helm template` of a chart whose template
/// was `{{ define "t" }}…{{ end }}{{ include "t" .Values.ctx }}` with `ctx()` as values).
#[test]
fn range_and_with_print_what_go_prints() {
    let cases: &[(&str, &str)] = &[
        (
            r#"${ range .ClusterLabels }[${ . }]${ end }"#,
            "[prod][east]",
        ),
        (
            r#"${ range $k, $v := .ClusterLabels }${ $k }=${ $v };${ end }"#,
            "env=prod;management.cattle.io/cluster-display-name=east;",
        ),
        (
            r#"${ range $i, $e := list "a" "b" }${ $i }:${ $e } ${ end }"#,
            "0:a 1:b ",
        ),
        (r#"${ range $e := list "a" "b" }${ $e }${ end }"#, "ab"),
        (
            r#"${ with get .ClusterValues "x" }${ . }${ else }none${ end }"#,
            "none",
        ),
        (
            r#"${ with .ClusterValues.someValue }${ . }${ else }none${ end }"#,
            "abc",
        ),
        (r#"${ range list 1 2 }${ $.ClusterName }${ end }"#, "c1c1"),
        (r#"${ $x := .ClusterName }${ $x }-${ $x | upper }"#, "c1-C1"),
        (
            r#"${ $last := "" }${ range list "a" "b" "c" }${ $last = . }${ end }${ $last }"#,
            "c",
        ),
        (r#"${ range list }x${ else }empty${ end }"#, "empty"),
        (
            r#"${ range $i, $e := list "a" "b" "c" "d" }${ if eq $i 1 }${ continue }${ end }${ if eq $e "d" }${ break }${ end }${ $e }${ end }"#,
            "ac",
        ),
        (r#"${ range 3 }${ . }${ end }"#, "012"),
        (r#"${ range $i := 3 }${ $i }${ end }"#, "012"),
        (
            r#"${ range $k, $v := .ClusterValues }${ $k }=${ $v } ${ end }"#,
            "nested=map[k:v] replicas=3 someValue=abc ",
        ),
        (
            r#"${ with $v := .ClusterValues.nested }${ $v.k }${ .k }${ end }"#,
            "vv",
        ),
        (
            r#"${ with get .ClusterValues "x" }x${ else with .ClusterValues.nested }${ .k }${ end }"#,
            "v",
        ),
        (
            r#"${ range $k, $v := .ClusterLabels }${ range list 1 2 }${ $k },${ end }${ end }"#,
            "env,env,management.cattle.io/cluster-display-name,management.cattle.io/cluster-display-name,",
        ),
        (
            r#"${ range $k, $v := dict "b" 1 "a" 2 }${ $k }${ $v }${ end }"#,
            "a2b1",
        ),
        (
            r#"${ $x := 1 }${ range list 2 }${ $x := . }${ $x }${ end }${ $x }"#,
            "21",
        ),
        (
            r#"${ range $i, $e := list "a" "b" }${ range list 1 2 3 }${ if eq . 2 }${ continue }${ end }${ $e }${ . }${ end }${ end }"#,
            "a1a3b1b3",
        ),
        (
            r#"${ range $i, $e := list "x" "y" }${ if $i }, ${ end }${ $e | quote }${ end }"#,
            "\"x\", \"y\"",
        ),
        (
            r#"${ range list "a" "b" }${ with $ }${ .ClusterName }${ end }${ . }${ end }"#,
            "c1ac1b",
        ),
        (r#"${ range -2 }x${ else }none${ end }"#, "none"),
        (
            r#"${ range $k, $v := .ClusterAnnotations }${ $k }${ else }none${ end }-${ range .ClusterValues.nested }${ . }${ end }"#,
            "team-v",
        ),
        (
            "${- range $k, $v := .ClusterLabels }\n${ $k }: ${ $v }\n${- end }",
            "\nenv: prod\nmanagement.cattle.io/cluster-display-name: east",
        ),
        (
            r#"${ $n := 0 }${ range list "a" "b" "c" }${ $n = len (list $n .) }${ end }${ $n }"#,
            "2",
        ),
        (
            r#"${ if $y := .ClusterName }${ $y }${ else }${ $y }none${ end }"#,
            "c1",
        ),
        (
            r#"${ range $i, $e := list (dict "n" "a") (dict "n" "b") }${ $i }${ $e.n }${ end }"#,
            "0a1b",
        ),
        (
            r#"${ range $e := .ClusterValues.nested }${ $e }${ end }${ range list 1 }${ break }x${ end }y"#,
            "vy",
        ),
    ];
    for (t, want) in cases {
        assert_eq!(render(t, &ctx()).as_deref(), Ok(*want), "{t}");
    }
}

/// What Go refuses, `range` and variables, is refused (the messages name the construct).
#[test]
fn range_and_variables_refuse_what_go_refuses() {
    for (t, want) in [
        ("${ break }", "${ break } outside ${ range }"),
        (
            "${ range list 1 }${ else }${ continue }${ end }",
            "${ continue } outside ${ range }",
        ),
        (
            "${ range list 1 }${ break 1 }${ end }",
            "break takes no arguments",
        ),
        (
            r#"${ range $i, $e := list "a" }${ end }${ $i }"#,
            r#"undefined variable "$i""#,
        ),
        ("${ $y }", r#"undefined variable "$y""#),
        ("${ if $a, $b := 1 }${ end }", "too many declarations in if"),
        (
            "${ range $a, $b, $c := list 1 }${ end }",
            "too many declarations in range",
        ),
        (
            "${ range $a, $b := 3 }${ end }",
            "can't use an integer to iterate over more than one variable",
        ),
        ("${ range .ClusterName }${ end }", "range over something"),
        ("${ range 2.5 }${ end }", "range over something"),
        ("${ $ := 1 }", "cannot declare or assign $"),
    ] {
        let m = e(t);
        assert!(m.contains(want), "{t}: {m}");
    }
    // Assigning a variable never declared fails when it runs, as in Go.
    assert_eq!(e("${ $y = 1 }"), r#"undefined variable "$y""#);
    assert_eq!(r("${ if false }${ $y = 1 }${ end }ok"), "ok");
}

#[test]
fn ranges_with_variables_are_bounded_like_the_others() {
    let open = r#"${ range $i, $e := splitList "," (repeat 1000 "a,") }"#;
    let bomb = format!("{}${{ $e }}{}", open.repeat(5), "${ end }".repeat(5));
    let mut budget = Budget::new(MAX_STEPS, std::time::Duration::from_secs(60));
    let m = render_within(&bomb, &ctx(), &mut budget).unwrap_err().0;
    assert_eq!(
        m,
        format!("template exceeded its budget of {MAX_STEPS} steps")
    );
    // `range 1000000000` is counted per iteration too (and makes no list).
    let m = e("${ range 1000000000 }${ end }");
    assert!(m.starts_with("template exceeded its budget of "), "{m}");
    // An ordinary keyed range over 1 000 entries stays far inside the budget.
    let mut budget = Budget::default();
    let t =
        r#"${ range $k, $v := splitList "," (repeat 999 "a,") }${ $k }=${ $v | upper };${ end }"#;
    let out = render_within(t, &ctx(), &mut budget).unwrap();
    assert!(
        out.starts_with("0=A;1=A;") && out.ends_with("999=;"),
        "{out}"
    );
    assert!(budget.steps() < MAX_STEPS / 50, "{}", budget.steps());
}
