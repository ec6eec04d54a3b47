//! tender's own binaries (`tender-hub`, `tender-agent`, `tender`) for tests that run them as
//! processes, built with `cargo build` into the target directory the tests run from.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use anyhow::{Context, Result, bail};

/// Paths of the built binaries.
#[derive(Debug, Clone)]
pub struct Binaries {
    /// `tender-hub`.
    pub hub: PathBuf,
    /// `tender-agent`.
    pub agent: PathBuf,
    /// `tender`, the CLI.
    pub cli: PathBuf,
}

/// The profile directory (`<target>/debug`) of the running test executable
/// (`<target>/debug/deps/<test>-<hash>`), else of `$CARGO_TARGET_DIR`, else `target/`.
fn profile_dir() -> PathBuf {
    if let Ok(exe) = std::env::current_exe()
        && let Some(deps) = exe.parent()
        && deps.file_name().is_some_and(|n| n == "deps")
        && let Some(profile) = deps.parent()
    {
        return profile.to_path_buf();
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target"));
    target.join("debug")
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("e2e/ lives in the workspace")
        .to_path_buf()
}

/// Builds the three binaries once per test process (`cargo build -p tender-hub-bin -p
/// tender-agent -p tender-cli`, a no-op when they are fresh) and returns their paths. The
/// build goes to the target directory the tests themselves were built in, so nothing is
/// compiled twice.
pub fn tender_binaries() -> Result<&'static Binaries> {
    static BINARIES: OnceLock<Binaries> = OnceLock::new();
    if let Some(b) = BINARIES.get() {
        return Ok(b);
    }
    let profile = profile_dir();
    let target = profile
        .parent()
        .context("the profile directory has a parent")?;
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    // `cargo test` gives the test process the variables of the package under test
    // (CARGO_PKG_*, OUT_DIR, …). Build scripts such as ring's rerun when those change, so
    // passing them on would rebuild half the dependency tree here and again in the next
    // `cargo test`; the nested build gets the environment of a plain shell instead. So does
    // RUSTC_BOOTSTRAP, which `.ci/suite-figures` sets for the test processes (libtest's
    // `--report-time`): cargo fingerprints it, and every crate would be rebuilt twice a run.
    for (key, _) in std::env::vars_os() {
        let Some(key) = key.to_str() else { continue };
        if key == "OUT_DIR"
            || key == "RUSTC_BOOTSTRAP"
            || key == "CARGO_PRIMARY_PACKAGE"
            || key == "CARGO_TARGET_TMPDIR"
            || [
                "CARGO_PKG_",
                "CARGO_MANIFEST_",
                "CARGO_CRATE_",
                "CARGO_BIN_",
            ]
            .iter()
            .any(|p| key.starts_with(p))
        {
            cmd.env_remove(key);
        }
    }
    cmd.args([
        "build",
        "--locked",
        "-p",
        "tender-hub-bin",
        "-p",
        "tender-agent",
        "-p",
        "tender-cli",
    ])
    .arg("--manifest-path")
    .arg(workspace_root().join("Cargo.toml"))
    .arg("--target-dir")
    .arg(target);
    match profile.file_name().and_then(|n| n.to_str()) {
        Some("debug") | None => {}
        Some("release") => {
            cmd.arg("--release");
        }
        Some(other) => {
            cmd.args(["--profile", other]);
        }
    }
    let status = cmd.status().context("running cargo build")?;
    if !status.success() {
        bail!("cargo build of tender-hub-bin, tender-agent and tender-cli failed ({status})");
    }
    let binaries = Binaries {
        hub: profile.join("tender-hub"),
        agent: profile.join("tender-agent"),
        cli: profile.join("tender"),
    };
    for b in [&binaries.hub, &binaries.agent, &binaries.cli] {
        if !b.exists() {
            bail!("{} is missing after cargo build", b.display());
        }
    }
    Ok(BINARIES.get_or_init(|| binaries))
}
