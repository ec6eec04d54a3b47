//! The prometheus-operator CRDs the charts' monitoring objects need (ServiceMonitor, PodMonitor,
//! PrometheusRule), made at test time: the operator's API types come from their Go module
//! (`github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring`, downloaded once
//! into Go's module cache) and `controller-gen`, built from `e2e/tools/controller-gen`, writes
//! their CRDs as the operator's own build does. Nothing is committed.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;

use crate::build::{ensure_go_binary, go_module_dir};

/// The prometheus-operator API module version the CRDs are made from.
pub const MONITORING_VERSION: &str = "v0.95.2";

const MONITORING_MODULE: &str =
    "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring";

/// The CRD files made, by the kinds the charts render.
const FILES: &[&str] = &[
    "monitoring.coreos.com_servicemonitors.yaml",
    "monitoring.coreos.com_podmonitors.yaml",
    "monitoring.coreos.com_prometheusrules.yaml",
];

fn tools() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tools/controller-gen")
}

/// Returns `controller-gen`, building it if needed (pinned in `e2e/tools/controller-gen`).
pub fn ensure_controller_gen() -> Result<PathBuf> {
    ensure_go_binary(
        &tools(),
        "sigs.k8s.io/controller-tools/cmd/controller-gen",
        "controller-gen",
        "-s -w",
        "controller-gen",
    )
}

/// The ServiceMonitor, PodMonitor and PrometheusRule CRDs, made by `controller-gen` from the
/// operator's `monitoring/v1` types (descriptions dropped, as they make no difference to what
/// the apiserver accepts).
pub fn crds() -> Result<Vec<CustomResourceDefinition>> {
    let controller_gen = ensure_controller_gen()?;
    let module = go_module_dir(&tools(), MONITORING_MODULE, MONITORING_VERSION)?;
    let out = std::env::temp_dir().join(crate::unique_name("tender-prometheus-operator-crds"));
    let status = Command::new(&controller_gen)
        .current_dir(&module)
        .arg("crd:maxDescLen=0")
        .arg("paths=./v1/...")
        .arg(format!("output:crd:dir={}", out.display()))
        .status()
        .context("running controller-gen")?;
    if !status.success() {
        bail!("controller-gen on {} failed ({status})", module.display());
    }
    let crds = FILES
        .iter()
        .map(|file| {
            let path = out.join(file);
            let text = std::fs::read_to_string(&path)
                .with_context(|| format!("reading {}", path.display()))?;
            serde_saphyr::from_str(&text).with_context(|| format!("parsing {}", path.display()))
        })
        .collect();
    let _ = std::fs::remove_dir_all(&out);
    crds
}

/// Installs the three CRDs (server-side apply) and waits until each is Established.
/// Idempotent.
pub async fn install_crds(client: &kube::Client) -> Result<()> {
    for mut crd in crds()? {
        crd.metadata.annotations = None;
        crd.status = None;
        crate::crds::apply_crd(client, &crd).await?;
    }
    Ok(())
}
