//! Peers that `tender-bench --peers` runs on tender's workloads: Flux's kustomize-controller
//! and Kyverno's admission and background controllers, built from their Go modules and their
//! CRDs read from the module archives (nothing vendored; see docs/benchmarks.md).
//!
//! Each peer's build recipe is a Go module under `e2e/tools/` carrying the peer's own
//! `replace` lines; the binaries are cached like the control plane's (a stamp over go.mod,
//! go.sum and the Go version, `~/.cache/tender/<name>/<stamp>/`, a file lock). Only the bench
//! calls this module: no test builds a peer.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;

use crate::build::{ensure_go_binary, go_module_dir};

/// Flux's kustomize-controller release the bench builds. Not v1.10.1: the module proxy refuses
/// four of its dependencies (see `e2e/tools/flux/go.mod` and docs/benchmarks.md).
pub const FLUX_KUSTOMIZE_VERSION: &str = "v1.9.6";
/// The source-controller release whose CRDs (ExternalArtifact and the kinds
/// kustomize-controller watches) the bench installs.
pub const FLUX_SOURCE_VERSION: &str = "v1.9.6";
/// Kyverno release the bench builds (admission and background controllers).
pub const KYVERNO_PEER_VERSION: &str = "v1.19.1";

fn tools(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tools")
        .join(name)
}

/// Flux's kustomize-controller binary, built on first use.
pub fn ensure_flux() -> Result<PathBuf> {
    ensure_go_binary(
        &tools("flux"),
        "github.com/fluxcd/kustomize-controller",
        "kustomize-controller",
        "-s -w",
        &format!("Flux's kustomize-controller {FLUX_KUSTOMIZE_VERSION}"),
    )
}

/// Kyverno's admission controller and background controller binaries, built on first use.
pub fn ensure_kyverno() -> Result<(PathBuf, PathBuf)> {
    let build = |package: &str, name: &str| {
        ensure_go_binary(
            &tools("kyverno-peer"),
            package,
            name,
            "-s -w",
            &format!("Kyverno's {name} {KYVERNO_PEER_VERSION}"),
        )
    };
    Ok((
        build("github.com/kyverno/kyverno/cmd/kyverno", "kyverno")?,
        build(
            "github.com/kyverno/kyverno/cmd/background-controller",
            "kyverno-background-controller",
        )?,
    ))
}

/// Every CRD (`*.yaml`) in directory `dir`, annotations and status dropped.
fn crds_in(dir: &Path) -> Result<Vec<CustomResourceDefinition>> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    files
        .iter()
        .map(|path| {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading {}", path.display()))?;
            let mut crd: CustomResourceDefinition = serde_saphyr::from_str(&text)
                .with_context(|| format!("parsing {}", path.display()))?;
            crd.metadata.annotations = None;
            crd.status = None;
            Ok(crd)
        })
        .collect()
}

/// Flux's CRDs: Kustomization (kustomize-controller's module) and the source kinds
/// kustomize-controller watches, ExternalArtifact among them (source-controller's module).
pub fn flux_crds() -> Result<Vec<CustomResourceDefinition>> {
    let kustomize = go_module_dir(
        &tools("flux"),
        "github.com/fluxcd/kustomize-controller",
        FLUX_KUSTOMIZE_VERSION,
    )?;
    let source = go_module_dir(
        &tools("flux"),
        "github.com/fluxcd/source-controller",
        FLUX_SOURCE_VERSION,
    )?;
    let mut crds = crds_in(&kustomize.join("config/crd/bases"))?;
    crds.extend(crds_in(&source.join("config/crd/bases"))?);
    Ok(crds)
}

/// Every CRD Kyverno's controllers watch (`config/crds/*/` of the module).
pub fn kyverno_crds() -> Result<Vec<CustomResourceDefinition>> {
    let dir = go_module_dir(
        &tools("kyverno-peer"),
        "github.com/kyverno/kyverno",
        KYVERNO_PEER_VERSION,
    )?
    .join("config/crds");
    let mut crds = Vec::new();
    let mut groups: Vec<PathBuf> = std::fs::read_dir(&dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_dir())
        .collect();
    groups.sort();
    for group in groups {
        crds.extend(crds_in(&group)?);
    }
    Ok(crds)
}
