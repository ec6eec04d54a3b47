//! Builds (once) and caches the control-plane binary from `e2e/controlplane`.
//!
//! The binary is keyed by a stamp over the Go sources, `go.mod`, `go.sum` and the Go
//! version, and kept under `$XDG_CACHE_HOME/tender/controlplane/<stamp>/` (default
//! `~/.cache`), outside the work tree, so a fresh clone on the same machine reuses it and
//! the Go build cache keeps even a changed stamp cheap.

use std::fs::{self, File};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use sha2::{Digest, Sha256};

/// The Kubernetes release the control plane is built from; `/version` reports it.
pub const KUBERNETES_VERSION: &str = "v1.36.3";

/// The Go module directory of the control plane (inside this repository).
pub fn source_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("controlplane")
}

fn cache_root() -> PathBuf {
    if let Some(dir) = std::env::var_os("TENDER_CACHE_DIR") {
        return PathBuf::from(dir);
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(std::env::temp_dir);
    base.join("tender")
}

/// Stamp over everything that changes the binary.
fn stamp(src: &Path) -> Result<String> {
    let mut files: Vec<PathBuf> = fs::read_dir(src)
        .with_context(|| format!("reading {}", src.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
            name.ends_with(".go") || name == "go.mod" || name == "go.sum"
        })
        .collect();
    files.sort();
    let mut h = Sha256::new();
    for f in &files {
        h.update(f.file_name().unwrap().as_encoded_bytes());
        h.update([0]);
        h.update(fs::read(f).with_context(|| format!("reading {}", f.display()))?);
        h.update([0]);
    }
    let go = Command::new("go")
        .arg("version")
        .output()
        .context("running `go version`: is Go installed and on PATH?")?;
    h.update(&go.stdout);
    Ok(hex::encode(&h.finalize()[..8]))
}

/// Returns the path of the control-plane binary, building it first if the cached one is
/// missing or stale. Concurrent callers (parallel test binaries, two environments) wait on
/// a file lock instead of building twice.
pub fn ensure_controlplane() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os("TENDER_CONTROLPLANE_BIN") {
        return Ok(PathBuf::from(p));
    }
    let minor = KUBERNETES_VERSION.split('.').nth(1).unwrap_or("0");
    let ldflags = [
        "-s -w".to_string(),
        format!("-X k8s.io/component-base/version.gitVersion={KUBERNETES_VERSION}"),
        "-X k8s.io/component-base/version.gitMajor=1".to_string(),
        format!("-X k8s.io/component-base/version.gitMinor={minor}"),
        "-X k8s.io/component-base/version.gitTreeState=clean".to_string(),
        format!("-X k8s.io/client-go/pkg/version.gitVersion={KUBERNETES_VERSION}"),
    ]
    .join(" ");
    ensure_go_binary(
        &source_dir(),
        ".",
        "controlplane",
        &ldflags,
        &format!("the control plane (Kubernetes {KUBERNETES_VERSION})"),
    )
}

/// Returns the path of the Helm CLI pinned in `e2e/tools/helm`, building it if needed.
pub fn ensure_helm() -> Result<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tools/helm");
    ensure_go_binary(
        &dir,
        "helm.sh/helm/v3/cmd/helm",
        "helm",
        "-s -w",
        "the Helm CLI",
    )
}

/// Returns `promql-check`, built from `e2e/tools/promql` (Prometheus's own rule-file reader
/// and PromQL parser, as `promtool check rules` uses them), building it if needed.
pub fn ensure_promql_check() -> Result<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tools/promql");
    ensure_go_binary(&dir, ".", "promql-check", "-s -w", "the PromQL checker")
}

/// Returns the path of the `kustomize build DIR` program of `e2e/tools/kustomize` (kustomize's
/// krusty library, `sigs.k8s.io/kustomize/api`), building it if needed: what `tender apply
/// --kustomize` runs in the tests.
pub fn ensure_kustomize() -> Result<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tools/kustomize");
    ensure_go_binary(&dir, ".", "kustomize", "-s -w", "kustomize (krusty)")
}

/// Returns the path of the OCI registry built from `e2e/tools/registry` (distribution's
/// registry with filesystem storage and htpasswd/token auth, plus an htpasswd writer and a
/// Bearer token issuer), building it if needed.
pub fn ensure_oci_registry() -> Result<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tools/registry");
    ensure_go_binary(&dir, ".", "oci-registry", "-s -w", "the OCI registry")
}

/// The directory of Go module `module@version`, downloaded into Go's module cache if needed
/// (`go mod download -json`, run in the tools module `tools`; it edits neither go.mod nor
/// go.sum there).
pub fn go_module_dir(tools: &Path, module: &str, version: &str) -> Result<PathBuf> {
    let out = Command::new("go")
        .current_dir(tools)
        .args(["mod", "download", "-json"])
        .arg(format!("{module}@{version}"))
        .output()
        .context("running `go mod download`: is Go installed and on PATH?")?;
    let info: serde_json::Value = serde_json::from_slice(&out.stdout).with_context(|| {
        format!(
            "`go mod download` of {module} {version} printed no JSON: {}",
            String::from_utf8_lossy(&out.stderr)
        )
    })?;
    if let Some(error) = info.get("Error").and_then(|e| e.as_str()) {
        bail!("`go mod download` of {module} {version} failed: {error}");
    }
    let dir = info
        .get("Dir")
        .and_then(|d| d.as_str())
        .context("`go mod download -json` printed no Dir")?;
    Ok(PathBuf::from(dir))
}

/// Builds `package` of the Go module in `src` into the cache, keyed by the module's stamp.
#[allow(unsafe_code)] // libc calls, each with a SAFETY comment
pub(crate) fn ensure_go_binary(
    src: &Path,
    package: &str,
    name: &str,
    ldflags: &str,
    what: &str,
) -> Result<PathBuf> {
    let stamp = stamp(src)?;
    let dir = cache_root().join(name).join(&stamp);
    let bin = dir.join(name);
    if bin.exists() {
        return Ok(bin);
    }
    fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let lock = File::create(dir.join(".lock"))?;
    // SAFETY: flock on a file descriptor we own; released when `lock` is dropped.
    if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) } != 0 {
        bail!("locking {}", dir.display());
    }
    if bin.exists() {
        return Ok(bin);
    }
    eprintln!(
        "tender-e2e: building {what} into {}; the first build downloads modules and takes minutes",
        dir.display()
    );
    let started = Instant::now();
    let tmp = dir.join(format!("{name}.partial"));
    let status = Command::new("go")
        .current_dir(src)
        .args(["build", "-trimpath", "-ldflags", ldflags, "-o"])
        .arg(&tmp)
        .arg(package)
        .status()
        .context("running `go build`: is Go installed and on PATH?")?;
    if !status.success() {
        bail!(
            "`go build` of {package} in {} failed ({status})",
            src.display()
        );
    }
    fs::rename(&tmp, &bin)?;
    eprintln!(
        "tender-e2e: built {what} in {:.0}s",
        started.elapsed().as_secs_f64()
    );
    Ok(bin)
}
