//! tender's CRDs installed into a real apiserver: valid objects are accepted and invalid
//! ones are rejected by the apiserver itself (OpenAPI schema + CEL), each with an error that
//! names the offending field.

use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, ApiResource, DynamicObject, ObjectMeta, PostParams};
use tender_e2e::{HUB, crds::install_crds, shared_env, unique_name};

/// The fixtures in `crates/types/tests/fixtures/valid`: every one must be accepted.
const VALID_FIXTURES: usize = 21;
/// The fixtures in `crates/types/tests/fixtures/invalid`: every one must be rejected.
const INVALID_FIXTURES: usize = 49;

/// Every fixture of `kind` (`valid` or `invalid`) with its text, sorted by path. Fails when the
/// directory holds anything that is not a `.yaml` fixture, so none is silently skipped.
fn fixtures(kind: &str) -> Vec<(PathBuf, String)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../crates/types/tests/fixtures")
        .join(kind);
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .map(|p| {
            assert!(
                p.extension().is_some_and(|e| e == "yaml"),
                "{} is not a .yaml fixture and would not be sent",
                p.display()
            );
            let text = std::fs::read_to_string(&p).unwrap();
            (p, text)
        })
        .collect();
    files.sort();
    files
}

fn api_for(client: &kube::Client, ns: &str, obj: &DynamicObject) -> Api<DynamicObject> {
    let types = obj.types.as_ref().expect("fixture has apiVersion and kind");
    let (group, version) = types.api_version.split_once('/').unwrap();
    let plural = format!("{}s", types.kind.to_lowercase());
    let ar = ApiResource {
        group: group.into(),
        version: version.into(),
        api_version: types.api_version.clone(),
        kind: types.kind.clone(),
        plural,
    };
    Api::namespaced_with(client.clone(), ns, &ar)
}

async fn setup() -> (kube::Client, String) {
    let env = shared_env(0).await;
    let client = env.client(HUB).await.unwrap();
    install_crds(&client).await.unwrap();
    let ns = unique_name("crds");
    Api::<Namespace>::all(client.clone())
        .create(
            &PostParams::default(),
            &Namespace {
                metadata: ObjectMeta {
                    name: Some(ns.clone()),
                    ..Default::default()
                },
                ..Default::default()
            },
        )
        .await
        .unwrap();
    (client, ns)
}

#[tokio::test]
async fn valid_objects_are_accepted() {
    let (client, ns) = setup().await;
    let files = fixtures("valid");
    assert_eq!(
        files.len(),
        VALID_FIXTURES,
        "valid fixtures found: {:#?}",
        files.iter().map(|(p, _)| p).collect::<Vec<_>>()
    );
    let mut accepted = 0;
    for (path, text) in files {
        let obj: DynamicObject = serde_saphyr::from_str(&text).unwrap();
        let api = api_for(&client, &ns, &obj);
        if let Err(e) = api.create(&PostParams::default(), &obj).await {
            panic!("{} was rejected: {e}", path.display());
        }
        accepted += 1;
    }
    assert_eq!(accepted, VALID_FIXTURES, "valid objects accepted");
}

#[tokio::test]
async fn invalid_objects_are_rejected_naming_the_field() {
    let (client, ns) = setup().await;
    let files = fixtures("invalid");
    assert_eq!(
        files.len(),
        INVALID_FIXTURES,
        "invalid fixtures found: {:#?}",
        files.iter().map(|(p, _)| p).collect::<Vec<_>>()
    );
    let mut rejected = 0;
    for (path, text) in &files {
        let expect = text
            .lines()
            .find_map(|l| l.strip_prefix("# expect:"))
            .map(str::trim)
            .unwrap_or_else(|| panic!("{} has no `# expect:` line", path.display()));
        let obj: DynamicObject = serde_saphyr::from_str(text).unwrap();
        let api = api_for(&client, &ns, &obj);
        match api.create(&PostParams::default(), &obj).await {
            Ok(_) => panic!("{} was accepted; expected: {expect}", path.display()),
            Err(kube::Error::Api(status)) => {
                assert_eq!(
                    status.code,
                    422,
                    "{}: expected 422 Invalid, got {status:?}",
                    path.display()
                );
                assert!(
                    status.message.contains(expect),
                    "{}: error does not contain {expect:?}:\n{}",
                    path.display(),
                    status.message
                );
                rejected += 1;
            }
            Err(e) => panic!("{}: unexpected error {e}", path.display()),
        }
    }
    assert_eq!(
        rejected, INVALID_FIXTURES,
        "invalid objects rejected, each naming its field"
    );
}

#[tokio::test]
async fn kubectl_get_tender_category_and_printer_columns_are_served() {
    let (client, ns) = setup().await;
    // Discovery is what `kubectl get tender` and `kubectl get tbundle` resolve through.
    let req = http::Request::get("/apis/tender.dev/v1alpha1")
        .body(Vec::new())
        .unwrap();
    let list: serde_json::Value = client.request(req).await.unwrap();
    let resources = list["resources"].as_array().unwrap();
    for plural in [
        "clusters",
        "clustergroups",
        "bundles",
        "bundledeployments",
        "helmops",
    ] {
        let r = resources
            .iter()
            .find(|r| r["name"] == plural)
            .unwrap_or_else(|| panic!("{plural} not served"));
        assert!(
            r["categories"]
                .as_array()
                .is_some_and(|c| c.iter().any(|c| c == "tender")),
            "{plural} is not in the tender category"
        );
        assert!(
            r["shortNames"].as_array().is_some_and(|s| !s.is_empty()),
            "{plural} has no short name"
        );
    }

    // The columns `kubectl get bundles` (and helmops) prints come from the server-side Table
    // conversion.
    for (plural, wants) in [
        ("bundles", &["Clusters-Ready", "Status", "Age"][..]),
        (
            "helmops",
            &["Chart", "Version", "Clusters-Ready", "Status", "Age"][..],
        ),
    ] {
        let req = http::Request::get(format!(
            "/apis/tender.dev/v1alpha1/namespaces/{ns}/{plural}"
        ))
        .header(
            "Accept",
            "application/json;as=Table;v=v1;g=meta.k8s.io,application/json",
        )
        .body(Vec::new())
        .unwrap();
        let table: serde_json::Value = client.request(req).await.unwrap();
        let columns: Vec<&str> = table["columnDefinitions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["name"].as_str().unwrap())
            .collect();
        for want in wants {
            assert!(
                columns.contains(want),
                "{plural} columns {columns:?} lack {want}"
            );
        }
    }
}
