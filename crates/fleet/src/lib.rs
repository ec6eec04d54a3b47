//! `tender apply`'s conversion: Fleet's fleet.yaml directories into `tender.dev` Bundles,
//! without touching a cluster. Read Fleet's `internal/bundlereader` and
//! `internal/cmd/cli/apply` for the behaviour this follows; docs/migrating-from-fleet.md has
//! the per-field table and decision 0124 the choices.
//!
//! Every refusal of every directory is collected: [`convert`] returns either all the Bundles
//! or all the refusals, never a part.

mod convert;
mod files;
pub mod names;
mod resources;
mod schema;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use tender_types::Bundle;

/// Fleet's limit on a Bundle's serialized size (bytes of JSON) before it compresses.
pub const MAX_BUNDLE_BYTES: usize = 1_000_000;

/// How to convert.
#[derive(Clone, Debug)]
pub struct Options {
    /// Prefix of every Bundle name, as the NAME argument of `fleet apply` (a GitRepo's name).
    pub name: Option<String>,
    /// Labels set on every Bundle (a fleet.yaml's `labels` win).
    pub labels: BTreeMap<String, String>,
    /// Fleet's `--targets-file`: a YAML file with `targets` (and `targetRestrictions`).
    pub targets_file: Option<PathBuf>,
    /// The kustomize binary.
    pub kustomize: PathBuf,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            name: None,
            labels: BTreeMap::new(),
            targets_file: None,
            kustomize: PathBuf::from("kustomize"),
        }
    }
}

/// One field or file `tender apply` cannot map, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// The fleet.yaml directory.
    pub dir: PathBuf,
    /// The field (`helm.atomic`, `targetCustomizations[1].diff`) or file.
    pub path: String,
    /// Why.
    pub reason: String,
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}: {}", self.dir.display(), self.path, self.reason)
    }
}

/// Why nothing was converted.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Fields or files that cannot be mapped, in every directory.
    #[error("{} refused field(s) or file(s); nothing was applied:\n{}", .0.len(), list(.0))]
    Refused(Vec<Refusal>),
    /// A directory given could not be read.
    #[error("reading {path}")]
    Io {
        /// The path.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
}

fn list(refusals: &[Refusal]) -> String {
    refusals
        .iter()
        .map(|r| format!("  {r}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The Bundles made from one fleet.yaml directory (several when targets render different
/// manifests; none when it holds nothing to deploy, as `fleet apply` skips it).
#[derive(Clone, Debug)]
pub struct Converted {
    /// The directory.
    pub dir: PathBuf,
    /// Its Bundles (namespace unset).
    pub bundles: Vec<Bundle>,
}

/// The directories `fleet apply` makes Bundles of under `root` (Fleet's
/// `shouldCreateBundleForThisPath`): every directory holding a fleet.yaml, and `root` itself
/// without one when YAML lies in it or below it outside those directories; dot directories
/// skipped.
pub fn bundle_dirs(root: &Path) -> Result<Vec<PathBuf>, Error> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| Error::Io { path, source }
    };
    let mut found = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        if has_fleet_yaml(&dir) {
            found.push(dir.clone());
        }
        let mut subdirs = Vec::new();
        for entry in std::fs::read_dir(&dir).map_err(io(&dir))? {
            let entry = entry.map_err(io(&dir))?;
            let name = entry.file_name();
            if entry.path().is_dir() && !name.to_string_lossy().starts_with('.') {
                subdirs.push(entry.path());
            }
        }
        subdirs.sort();
        stack.extend(subdirs.into_iter().rev());
    }
    if !has_fleet_yaml(root) && loose_yaml(root) {
        found.push(root.to_path_buf());
    }
    found.sort();
    Ok(found)
}

/// Fleet's `hasSubDirectoryWithResourcesAndWithoutFleetYaml`: a `.yaml`/`.yml` file in `dir`
/// or below it, outside directories holding a fleet.yaml (dot directories skipped, as their
/// files are never read).
fn loose_yaml(dir: &Path) -> bool {
    if has_fleet_yaml(dir) {
        return false;
    }
    let Ok(entries) = std::fs::read_dir(dir) else {
        return false;
    };
    entries.filter_map(Result::ok).any(|e| {
        let name = e.file_name().to_string_lossy().into_owned();
        let path = e.path();
        if path.is_dir() {
            !name.starts_with('.') && loose_yaml(&path)
        } else {
            name.ends_with(".yaml") || name.ends_with(".yml")
        }
    })
}

fn has_fleet_yaml(dir: &Path) -> bool {
    dir.join("fleet.yaml").is_file() || dir.join("fleet.yml").is_file()
}

/// Two directories making a Bundle of the same name would overwrite each other.
fn duplicates(converted: &[Converted], refusals: &mut Vec<Refusal>) {
    let mut seen: BTreeMap<String, &Path> = BTreeMap::new();
    for c in converted {
        for b in &c.bundles {
            let name = b.metadata.name.clone().unwrap_or_default();
            if let Some(first) = seen.insert(name.clone(), &c.dir) {
                refusals.push(Refusal {
                    dir: c.dir.clone(),
                    path: "name".into(),
                    reason: format!(
                        "Bundle {name} is also made from {}: set `name` in one fleet.yaml, or --name",
                        first.display()
                    ),
                });
            }
        }
    }
}

/// The tree the files a fleet.yaml names must stay in: the Git repository holding `root` (a
/// fleet.yaml may name `../values.yaml` of its repository, as in a Fleet GitRepo), else `root`
/// itself. Canonical.
fn repository_of(root: &Path) -> PathBuf {
    let root = std::fs::canonicalize(root).unwrap_or_else(|_| root.to_path_buf());
    root.ancestors()
        .find(|d| d.join(".git").exists())
        .unwrap_or(&root)
        .to_path_buf()
}

/// Converts every fleet.yaml directory under each of `roots` (see [`bundle_dirs`]): all the
/// Bundles, or every refusal of every directory.
pub fn convert(roots: &[PathBuf], opts: &Options) -> Result<Vec<Converted>, Error> {
    let mut out = Vec::new();
    let mut refusals = Vec::new();
    let targets_file = match &opts.targets_file {
        Some(path) => match convert::read_targets_file(path) {
            Ok(t) => Some(t),
            Err(reason) => {
                refusals.push(Refusal {
                    dir: path.clone(),
                    path: "--targets-file".into(),
                    reason,
                });
                None
            }
        },
        None => None,
    };
    for root in roots {
        let boundary = repository_of(root);
        for dir in bundle_dirs(root)? {
            let mut id = names::bundle_id(
                opts.name.as_deref().unwrap_or_default(),
                &dir.to_string_lossy(),
            );
            if id.is_empty() {
                // `tender apply` in the directory itself without --name: its own name.
                id = std::fs::canonicalize(&dir)
                    .ok()
                    .and_then(|d| d.file_name().map(|f| f.to_string_lossy().into_owned()))
                    .unwrap_or_else(|| "bundle".into());
            }
            match convert::directory(&dir, &boundary, &id, opts, targets_file.as_ref()) {
                Ok(bundles) => out.push(Converted {
                    dir: dir.clone(),
                    bundles,
                }),
                Err(found) => refusals.extend(found.into_iter().map(|(path, reason)| Refusal {
                    dir: dir.clone(),
                    path,
                    reason,
                })),
            }
        }
    }
    duplicates(&out, &mut refusals);
    if refusals.is_empty() {
        Ok(out)
    } else {
        Err(Error::Refused(refusals))
    }
}
