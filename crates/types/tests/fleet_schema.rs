//! Every field of Fleet's Bundle and HelmOp specs is declared by tender's CRD of the same kind —
//! implemented, accepted with no effect, or refused by name with its reason — so a Fleet object
//! is never cut down by structural pruning nor refused with "field not declared in schema"
//! (decision 0125-fleet-defaults-and-forms). The fixtures are Fleet's own CRDs, verbatim
//! (`tests/fixtures/fleet/`, source and commit in their first lines).

use std::path::Path;

use serde_json::Value;

fn fleet_spec(file: &str) -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/fleet")
        .join(file);
    let text = std::fs::read_to_string(&path).unwrap();
    let crd: Value = serde_saphyr::from_str(&text).unwrap();
    spec_of(&crd)
}

fn tender_spec(kind: &str) -> Value {
    let crd = tender_types::crds()
        .into_iter()
        .find(|c| c.spec.names.kind == kind)
        .unwrap();
    spec_of(&serde_json::to_value(crd).unwrap())
}

fn spec_of(crd: &Value) -> Value {
    crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"].clone()
}

/// Walks Fleet's schema `fleet` at `path` beside tender's `tender`, noting every property
/// tender does not declare and every type that differs.
fn walk(fleet: &Value, tender: Option<&Value>, path: &str, gaps: &mut Vec<String>) {
    let Some(tender) = tender else {
        gaps.push(format!("{path}: not declared"));
        return;
    };
    let open = |s: &Value| {
        s["x-kubernetes-preserve-unknown-fields"] == Value::Bool(true)
            || s["x-kubernetes-int-or-string"] == Value::Bool(true)
    };
    if open(tender) {
        return; // whatever Fleet puts below is kept (values, refused objects)
    }
    if let (Some(f), Some(t)) = (fleet["type"].as_str(), tender["type"].as_str())
        && f != t
    {
        gaps.push(format!("{path}: Fleet's type {f}, tender's {t}"));
    }
    if let Some(props) = fleet["properties"].as_object() {
        for (name, sub) in props {
            let theirs = tender["properties"].get(name);
            walk(sub, theirs, &format!("{path}.{name}"), gaps);
        }
    }
    if fleet.get("items").is_some() {
        let items = tender.get("items").unwrap_or(&Value::Null);
        walk(&fleet["items"], Some(items), &format!("{path}[]"), gaps);
    }
    if fleet["additionalProperties"].is_object() {
        let theirs = tender.get("additionalProperties").filter(|v| v.is_object());
        walk(
            &fleet["additionalProperties"],
            theirs,
            &format!("{path}{{}}"),
            gaps,
        );
    }
}

/// Every property path of a schema, for the count in the message.
fn paths(schema: &Value) -> usize {
    let mut n = 0;
    if let Some(props) = schema["properties"].as_object() {
        for sub in props.values() {
            n += 1 + paths(sub);
        }
    }
    if let Some(items) = schema.get("items") {
        n += paths(items);
    }
    n
}

/// Fails, listing them all, when tender's CRD `kind` leaves a path of Fleet's out.
fn assert_declared(fleet_file: &str, kind: &str) {
    let fleet = fleet_spec(fleet_file);
    let n = paths(&fleet);
    assert!(
        n > 200,
        "the fixture is Fleet's whole {kind} spec ({n} paths)"
    );
    let mut gaps = Vec::new();
    walk(&fleet, Some(&tender_spec(kind)), "spec", &mut gaps);
    assert!(
        gaps.is_empty(),
        "Fleet's {kind} fields tender neither implements nor refuses (add them to \
         crates/types/src/fleet_only.rs with the reason):\n{}",
        gaps.join("\n")
    );
}

#[test]
fn every_field_of_fleets_bundle_spec_is_declared() {
    assert_declared("bundles.fleet.cattle.io.yaml", "Bundle");
}

#[test]
fn every_field_of_fleets_helmop_spec_is_declared() {
    assert_declared("helmops.fleet.cattle.io.yaml", "HelmOp");
}

#[test]
fn the_walk_finds_an_undeclared_field() {
    let fleet = serde_json::json!({"type": "object", "properties": {
        "kept": {"type": "string"},
        "list": {"type": "array", "items": {"type": "object", "properties": {"x": {"type": "integer"}}}},
        "values": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}
    }});
    let tender = serde_json::json!({"type": "object", "properties": {
        "kept": {"type": "integer"},
        "list": {"type": "array", "items": {"type": "object", "properties": {}}},
        "values": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}
    }});
    let mut gaps = Vec::new();
    walk(&fleet, Some(&tender), "spec", &mut gaps);
    assert_eq!(
        gaps,
        [
            "spec.kept: Fleet's type string, tender's integer",
            "spec.list[].x: not declared"
        ]
    );
}
