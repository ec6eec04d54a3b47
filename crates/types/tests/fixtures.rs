//! Sanity checks of the CRD validation fixtures (the e2e suite sends them to a real apiserver).

use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use tender_types::{Bundle, BundleDeployment, Cluster, ClusterGroup, HelmOp};

fn fixtures(kind: &str) -> Vec<(PathBuf, String)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(kind);
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .map(|p| {
            let text = std::fs::read_to_string(&p).unwrap();
            (p, text)
        })
        .collect();
    files.sort();
    files
}

fn kind_of(text: &str) -> String {
    let value: serde_json::Value = serde_saphyr::from_str(text).unwrap();
    value["kind"].as_str().unwrap().to_string()
}

fn parses<T: DeserializeOwned>(path: &Path, text: &str) {
    if let Err(err) = serde_saphyr::from_str::<T>(text) {
        panic!("{} does not deserialize: {err}", path.display());
    }
}

#[test]
fn valid_fixtures_deserialize_into_the_types() {
    let files = fixtures("valid");
    assert!(files.len() >= 5);
    for (path, text) in files {
        match kind_of(&text).as_str() {
            "Cluster" => parses::<Cluster>(&path, &text),
            "ClusterGroup" => parses::<ClusterGroup>(&path, &text),
            "Bundle" => parses::<Bundle>(&path, &text),
            "BundleDeployment" => parses::<BundleDeployment>(&path, &text),
            "HelmOp" => parses::<HelmOp>(&path, &text),
            other => panic!("{}: unexpected kind {other}", path.display()),
        }
    }
}

#[test]
fn invalid_fixtures_each_state_one_expected_error() {
    let files = fixtures("invalid");
    assert!(
        files.len() >= 12,
        "the e2e suite needs at least 12 invalid objects"
    );
    let mut expectations = Vec::new();
    for (path, text) in files {
        let expects: Vec<&str> = text
            .lines()
            .filter_map(|l| l.strip_prefix("# expect: "))
            .collect();
        assert_eq!(
            expects.len(),
            1,
            "{}: needs exactly one `# expect:` line",
            path.display()
        );
        assert!(!expects[0].trim().is_empty(), "{}", path.display());
        assert!(
            ["Cluster", "ClusterGroup", "Bundle", "HelmOp"].contains(&kind_of(&text).as_str()),
            "{}",
            path.display()
        );
        expectations.push(expects[0].to_string());
    }
}
