//! Kyverno's real CRDs for the "any kind" tests, read from Kyverno's Go module archive.
//!
//! `go mod download -json github.com/kyverno/kyverno@<KYVERNO_VERSION>` (run in
//! `e2e/tools/kyverno`) puts the module in Go's module cache and prints its directory; the
//! CRDs are read from `config/crds/kyverno/` there. Nothing is committed: Go's module cache is
//! the cache, so later runs cost one `go` invocation and no download.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;

/// The Kyverno release whose CRDs the tests install.
pub const KYVERNO_VERSION: &str = "v1.13.4";

/// The extracted Kyverno module directory (downloaded once into Go's module cache).
pub fn module_dir() -> Result<PathBuf> {
    let tools = Path::new(env!("CARGO_MANIFEST_DIR")).join("tools/kyverno");
    crate::build::go_module_dir(&tools, "github.com/kyverno/kyverno", KYVERNO_VERSION)
}

/// Kyverno's CRD `file` (e.g. `kyverno.io_clusterpolicies.yaml`) from the module.
pub fn crd(file: &str) -> Result<CustomResourceDefinition> {
    let path = module_dir()?.join("config/crds/kyverno").join(file);
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    serde_saphyr::from_str(&text).with_context(|| format!("parsing {}", path.display()))
}

/// Installs Kyverno's ClusterPolicy and Policy CRDs (server-side apply) and waits until they
/// are Established. Idempotent.
pub async fn install_policy_crds(client: &kube::Client) -> Result<()> {
    for file in [
        "kyverno.io_clusterpolicies.yaml",
        "kyverno.io_policies.yaml",
    ] {
        let mut crd = crd(file)?;
        crd.metadata.annotations = None;
        crd.status = None;
        crate::crds::apply_crd(client, &crd)
            .await
            .with_context(|| format!("installing Kyverno's {file}"))?;
    }
    Ok(())
}
