//! Every fleet.yaml directory of fleet-examples and fleet-test-data (e2e/fixtures/fleet-repos)
//! converted, its outcome summarised (Bundle names, targets, chart, resources; or the exact
//! refusal paths) and compared with `fixtures.expected`. Kustomize runs as a stub printing one
//! ConfigMap named after the directory it was given, so the variants are checked here and the
//! real kustomize in the e2e suite.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use tender_fleet::{Error, Options, convert};

fn repos() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../e2e/fixtures/fleet-repos")
}

fn stub_kustomize(dir: &Path) -> PathBuf {
    let path = dir.join("kustomize");
    std::fs::write(
        &path,
        "#!/bin/sh\nd=$(basename \"$2\")\nprintf 'apiVersion: v1\\nkind: ConfigMap\\nmetadata:\\n  name: kustomized-%s\\n' \"$d\"\n",
    )
    .unwrap();
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    path
}

fn summary(dir: &Path, opts: &Options) -> String {
    let mut out = String::new();
    match convert(&[dir.to_path_buf()], opts) {
        Err(Error::Refused(refusals)) => {
            for r in refusals {
                assert_eq!(r.dir, dir);
                writeln!(out, "  refused {}", r.path).unwrap();
            }
        }
        Err(e) => writeln!(out, "  error {e}").unwrap(),
        Ok(converted) => {
            for c in converted {
                if c.bundles.is_empty() {
                    writeln!(out, "  {}: nothing to deploy", c.dir.display()).unwrap();
                }
                for b in c.bundles {
                    let v = serde_json::to_value(&b).unwrap();
                    let spec = &v["spec"];
                    writeln!(out, "  bundle {}", b.metadata.name.as_deref().unwrap()).unwrap();
                    for t in spec["targets"].as_array().unwrap() {
                        let mut t = t.clone();
                        let name = t
                            .as_object_mut()
                            .unwrap()
                            .remove("name")
                            .unwrap_or_default();
                        writeln!(out, "    target {} {}", name.as_str().unwrap_or("-"), t).unwrap();
                    }
                    for key in [
                        "defaultNamespace",
                        "targetNamespace",
                        "helm",
                        "correctDrift",
                        "diff",
                        "namespaceLabels",
                        "takeOwnership",
                    ] {
                        if let Some(x) = spec.get(key) {
                            writeln!(out, "    {key} {x}").unwrap();
                        }
                    }
                    for r in spec["resources"].as_array().into_iter().flatten() {
                        match r.get("content") {
                            Some(_) => writeln!(
                                out,
                                "    file {} {}",
                                r["name"].as_str().unwrap(),
                                r.get("encoding").and_then(|e| e.as_str()).unwrap_or("")
                            )
                            .unwrap(),
                            None => writeln!(
                                out,
                                "    object {} {} {}",
                                r["kind"].as_str().unwrap(),
                                r["metadata"]["name"].as_str().unwrap_or(""),
                                r.pointer("/spec/replicas")
                                    .map(|x| x.to_string())
                                    .unwrap_or_default()
                            )
                            .unwrap(),
                        }
                    }
                }
            }
        }
    }
    out
}

#[test]
fn every_fixture_converts_as_expected() {
    let tmp = std::env::temp_dir().join(format!("tender-fleet-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    let opts = Options {
        kustomize: stub_kustomize(&tmp),
        ..Options::default()
    };
    // Relative paths, as a user in a checkout runs `tender apply multi-cluster/helm`: the
    // Bundle names are Fleet's for a GitRepo named after the repository.
    std::env::set_current_dir(repos()).unwrap();
    let mut dirs = Vec::new();
    for repo in ["fleet-examples", "fleet-test-data"] {
        // Each fleet.yaml directory (the repository roots hold no fleet.yaml of their own).
        dirs.extend(
            tender_fleet::bundle_dirs(Path::new(repo))
                .unwrap()
                .into_iter()
                .filter(|d| d.join("fleet.yaml").is_file()),
        );
    }
    let mut actual = String::new();
    for dir in &dirs {
        let rel = dir.display().to_string();
        writeln!(actual, "{rel}").unwrap();
        actual.push_str(&summary(dir, &opts));
    }
    let expected_path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures.expected");
    if std::env::var_os("UPDATE_EXPECTED").is_some() {
        std::fs::write(&expected_path, &actual).unwrap();
    }
    let expected = std::fs::read_to_string(&expected_path).unwrap_or_default();
    assert!(
        actual == expected,
        "outcomes differ from tests/fixtures.expected (UPDATE_EXPECTED=1 to rewrite, then review the diff):\n{actual}"
    );
    assert_eq!(dirs.len(), 55);
}
