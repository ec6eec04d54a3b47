//! The committed `deploy/crds/*.yaml` must be exactly what the Rust types generate.

use std::path::Path;

#[test]
fn committed_crds_match_the_types() {
    for rel in tender_crdgen::DEFAULT_OUT_DIRS {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../..")
            .join(rel);
        let problems = tender_crdgen::diff(&dir).expect("comparing CRDs");
        assert!(
            problems.is_empty(),
            "{rel} is stale:\n{}\nrun `cargo run -p tender-crdgen` and commit the result",
            problems.join("\n")
        );
    }
}

#[test]
fn rendered_crds_parse_back() {
    for (file, text) in tender_crdgen::render().unwrap() {
        let crd: k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition =
            serde_saphyr::from_str(&text).unwrap_or_else(|e| panic!("{file}: {e}"));
        assert_eq!(crd.spec.group, "tender.dev", "{file}");
        assert_eq!(
            crd.spec.names.categories,
            Some(vec!["tender".to_string()]),
            "{file}"
        );
        assert_eq!(crd.spec.scope, "Namespaced", "{file}");
    }
}
