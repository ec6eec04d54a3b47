//! Kyverno's real CRDs for the "any kind" tests, read from Kyverno's Go module archive.
//!
//! `go mod download -json github.com/kyverno/kyverno@<KYVERNO_VERSION>` (run in
//! `e2e/tools/kyverno`) puts the module in Go's module cache and prints its directory; the
//! CRDs are read from `config/crds/kyverno/` there. Nothing is committed: Go's module cache is
//! the cache, so later runs cost one `go` invocation and no download.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;

/// The Kyverno release whose CRDs the tests install.
pub const KYVERNO_VERSION: &str = "v1.13.4";

/// The extracted Kyverno module directory (downloaded once into Go's module cache).
pub fn module_dir() -> Result<PathBuf> {
    let tools = Path::new(env!("CARGO_MANIFEST_DIR")).join("tools/kyverno");
    let out = Command::new("go")
        .current_dir(&tools)
        .args(["mod", "download", "-json"])
        .arg(format!("github.com/kyverno/kyverno@{KYVERNO_VERSION}"))
        .output()
        .context("running `go mod download`: is Go installed and on PATH?")?;
    let info: serde_json::Value = serde_json::from_slice(&out.stdout).with_context(|| {
        format!(
            "`go mod download` of Kyverno {KYVERNO_VERSION} printed no JSON: {}",
            String::from_utf8_lossy(&out.stderr)
        )
    })?;
    if let Some(error) = info.get("Error").and_then(|e| e.as_str()) {
        bail!("`go mod download` of Kyverno {KYVERNO_VERSION} failed: {error}");
    }
    let dir = info
        .get("Dir")
        .and_then(|d| d.as_str())
        .context("`go mod download -json` printed no Dir")?;
    Ok(PathBuf::from(dir))
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
