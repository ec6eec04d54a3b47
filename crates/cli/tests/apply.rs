//! `tender apply` as a user runs it, without a hub: `--help`, `-o json`, and the refusal
//! output (every refusal of every directory, exit code 2, nothing applied).

use std::path::{Path, PathBuf};
use std::process::Command;

fn repos() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../e2e/fixtures/fleet-repos")
}

fn tender(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_tender"))
        .args(args)
        .current_dir(repos())
        // No hub: a command that tried to connect would fail with exit code 1.
        .env("KUBECONFIG", "/nonexistent")
        .output()
        .unwrap()
}

#[test]
fn help_names_the_flags() {
    let out = tender(&["apply", "--help"]);
    assert!(out.status.success());
    let help = String::from_utf8(out.stdout).unwrap();
    for flag in [
        "--name",
        "--namespace",
        "--output",
        "--dry-run",
        "--targets-file",
        "--label",
        "--kustomize",
        "--force-conflicts",
        "[DIRS]...",
        "Exit codes: 0 applied (or printed); 2 a field or file cannot be mapped",
    ] {
        assert!(help.contains(flag), "{flag} missing from:\n{help}");
    }
}

#[test]
fn prints_bundles_with_o_json_in_the_namespace_given() {
    let out = tender(&[
        "apply",
        "fleet-examples/multi-cluster/helm",
        "fleet-test-data/simple",
        "-n",
        "ws",
        "-l",
        "team=a",
        "-o",
        "json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let bundles: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let names: Vec<&str> = bundles
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["metadata"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "fleet-examples-multi-cluster-helm",
            "fleet-test-data-simple"
        ]
    );
    for b in bundles.as_array().unwrap() {
        assert_eq!(b["metadata"]["namespace"], "ws");
        assert_eq!(b["metadata"]["labels"]["team"], "a");
    }
    assert_eq!(
        bundles[0]["spec"]["targets"][2]["helm"]["values"]["serviceType"],
        "LoadBalancer"
    );
    // The same Bundles as YAML documents.
    let out = tender(&[
        "apply",
        "fleet-examples/multi-cluster/helm",
        "fleet-test-data/simple",
        "-n",
        "ws",
        "-l",
        "team=a",
        "-o",
        "yaml",
    ]);
    let docs: Vec<serde_json::Value> =
        serde_saphyr::from_multiple(&String::from_utf8(out.stdout).unwrap()).unwrap();
    assert_eq!(serde_json::Value::Array(docs), bundles);
}

#[test]
fn refusals_of_every_directory_are_listed_with_exit_code_2() {
    let out = tender(&[
        "apply",
        "fleet-test-data/imagescans",
        "fleet-test-data/helm-schemas/set",
        "fleet-test-data/simple",
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(out.stdout.is_empty());
    let err = String::from_utf8(out.stderr).unwrap();
    assert_eq!(
        err.lines().collect::<Vec<_>>(),
        [
            "error: 2 refused field(s) or file(s); nothing was applied:",
            "  fleet-test-data/imagescans: imageScans: tender has no image scanning: Fleet's ImageScans write image tags back to the Git repository",
            "  fleet-test-data/helm-schemas/set: helm.skipSchemaValidation: values are always checked against the chart's values.schema.json",
        ]
    );
}
