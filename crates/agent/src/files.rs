//! Files carried in a BundleDeployment's `resources` (Fleet's `{name, content, encoding}`,
//! decision 0123-files-in-a-bundle): decoded within bounds, then read as Fleet's
//! `DetermineStyle` does, simplified — the chart directory `helm.chart` names (packed into an
//! archive rendered exactly like a repository's), and `*.yaml`/`*.yml`/`*.json` manifest files
//! outside any chart directory, applied like inline manifests. Other files are ignored. Pure.
//! [`documents`] splits a YAML stream for the chart renderer too.

use std::collections::BTreeSet;
use std::io::Read;

use base64::Engine;
use serde_json::{Value, json};
use tender_types::{FileEntry, Manifest};

/// Largest decoded content of one file.
pub const MAX_FILE_BYTES: u64 = 1024 * 1024;
/// Largest decoded content of all files of one deployment.
pub const MAX_TOTAL_BYTES: u64 = 8 * 1024 * 1024;

/// One decoded file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct File {
    /// Its path relative to the fleet.yaml directory, `./` and empty segments removed.
    pub name: String,
    /// Its decoded content.
    pub bytes: Vec<u8>,
}

/// Why the files cannot be used, naming the file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileError {
    /// The file (or the path that is missing).
    pub file: String,
    /// What is wrong with it.
    pub message: String,
}

impl std::fmt::Display for FileError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.file, self.message)
    }
}

impl std::error::Error for FileError {}

impl FileError {
    fn new(file: &str, message: impl Into<String>) -> Self {
        Self {
            file: file.to_string(),
            message: message.into(),
        }
    }

    /// The entry a file error stands as among the manifests: `File` `<path>`, kind
    /// `files.tender.dev/v1` (never applied: it is reported as an error and blocks pruning).
    pub fn manifest(&self) -> Manifest {
        Manifest(json!({
            "apiVersion": "files.tender.dev/v1",
            "kind": "File",
            "metadata": {"name": self.file},
        }))
    }
}

/// The path of a file name: `./` and empty segments dropped.
pub fn clean(name: &str) -> String {
    name.split('/')
        .filter(|p| !p.is_empty() && *p != ".")
        .collect::<Vec<_>>()
        .join("/")
}

/// Decodes every file, within [`MAX_FILE_BYTES`] each and [`MAX_TOTAL_BYTES`] in all (a gzip
/// bomb stops at the bound).
pub fn decode_all(entries: impl IntoIterator<Item = FileEntry>) -> Result<Vec<File>, FileError> {
    let mut left = MAX_TOTAL_BYTES;
    let mut out = Vec::new();
    for e in entries {
        let name = clean(&e.name);
        if name.is_empty() || name.split('/').any(|p| p == "..") || e.name.starts_with('/') {
            return Err(FileError::new(
                &e.name,
                "a file name must be a relative path without '..' segments",
            ));
        }
        let bytes = decode(&e, left.min(MAX_FILE_BYTES))
            .map_err(|m| FileError::new(&name, m))?
            .ok_or_else(|| {
                let bound = if left < MAX_FILE_BYTES {
                    format!("the files together are larger than {MAX_TOTAL_BYTES} bytes decoded")
                } else {
                    format!("larger than {MAX_FILE_BYTES} bytes decoded")
                };
                FileError::new(&name, bound)
            })?;
        left -= bytes.len() as u64;
        out.push(File { name, bytes });
    }
    Ok(out)
}

/// One file's content decoded, `None` when it is larger than `max` bytes.
fn decode(e: &FileEntry, max: u64) -> Result<Option<Vec<u8>>, String> {
    let fits = |b: Vec<u8>| (b.len() as u64 <= max).then_some(b);
    let b64 = || {
        base64::engine::general_purpose::STANDARD
            .decode(e.content.trim())
            .map_err(|err| format!("content is not valid base64 ({err})"))
    };
    match e.encoding.as_str() {
        "" => Ok(fits(e.content.as_bytes().to_vec())),
        "base64" => Ok(fits(b64()?)),
        "base64+gz" => {
            let gz = b64()?;
            let mut out = Vec::new();
            flate2::read::GzDecoder::new(&gz[..])
                .take(max + 1)
                .read_to_end(&mut out)
                .map_err(|err| format!("content is not valid gzip ({err})"))?;
            Ok(fits(out))
        }
        other => Err(format!(
            "encoding {other:?} is not one of \"\", base64, base64+gz"
        )),
    }
}

/// The directories holding a `Chart.yaml` (`""` for the root).
pub fn chart_dirs(files: &[File]) -> BTreeSet<String> {
    files
        .iter()
        .filter_map(|f| match f.name.rsplit_once('/') {
            Some((dir, "Chart.yaml")) => Some(dir.to_string()),
            None if f.name == "Chart.yaml" => Some(String::new()),
            _ => None,
        })
        .collect()
}

/// Whether `name` is `dir` itself or below it (`""` holds everything).
fn under(name: &str, dir: &str) -> bool {
    dir.is_empty() || name.strip_prefix(dir).is_some_and(|r| r.starts_with('/'))
}

/// The files of the chart in directory `dir` (relative to it), `<dir>/Chart.yaml` required.
pub fn chart_files<'a>(files: &'a [File], dir: &str) -> Result<Vec<(String, &'a [u8])>, FileError> {
    let chart_yaml = if dir.is_empty() {
        "Chart.yaml".to_string()
    } else {
        format!("{dir}/Chart.yaml")
    };
    if !files.iter().any(|f| f.name == chart_yaml) {
        return Err(FileError::new(
            &chart_yaml,
            format!(
                "missing: helm.chart names the chart directory {:?} carried in resources, and no file is named {chart_yaml}",
                if dir.is_empty() { "." } else { dir }
            ),
        ));
    }
    let mut out: Vec<(String, &[u8])> = files
        .iter()
        .filter(|f| under(&f.name, dir))
        .map(|f| {
            let rel = if dir.is_empty() {
                f.name.clone()
            } else {
                f.name[dir.len() + 1..].to_string()
            };
            (rel, &f.bytes[..])
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out.dedup_by(|a, b| a.0 == b.0);
    Ok(out)
}

/// The chart in directory `dir` as a chart archive (`chart/<file>`, sorted, no timestamps:
/// the same files always give the same bytes, so the cache keys it by content).
pub fn chart_archive(files: &[File], dir: &str) -> Result<Vec<u8>, FileError> {
    let chart = chart_files(files, dir)?;
    let gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    let mut tar = tar::Builder::new(gz);
    let failed = |e: std::io::Error| FileError::new(dir, format!("packing the chart: {e}"));
    for (rel, bytes) in chart {
        let mut header = tar::Header::new_gnu();
        header.set_size(bytes.len() as u64);
        header.set_mode(0o644);
        header.set_mtime(0);
        header.set_entry_type(tar::EntryType::Regular);
        tar.append_data(&mut header, format!("chart/{rel}"), bytes)
            .map_err(failed)?;
    }
    tar.into_inner().and_then(|gz| gz.finish()).map_err(failed)
}

/// Whether a file is read as manifests: `*.yaml`, `*.yml` or `*.json`, not `fleet.yaml`, not
/// under a directory holding a `Chart.yaml`.
fn is_manifest_file(name: &str, charts: &BTreeSet<String>) -> bool {
    let base = name.rsplit('/').next().unwrap_or(name);
    let ext = [".yaml", ".yml", ".json"].iter().any(|e| base.ends_with(e));
    ext && base != "fleet.yaml" && !charts.iter().any(|d| under(name, d))
}

/// The manifests of the manifest files, in file order then document order: each document
/// with apiVersion, kind and metadata.name (a `…List` contributes its items); empty documents
/// skipped; anything else fails naming the file.
pub fn manifests(files: &[File]) -> Result<Vec<Manifest>, FileError> {
    let charts = chart_dirs(files);
    let mut out = Vec::new();
    for f in files.iter().filter(|f| is_manifest_file(&f.name, &charts)) {
        let text =
            std::str::from_utf8(&f.bytes).map_err(|_| FileError::new(&f.name, "not UTF-8 text"))?;
        for (i, doc) in documents(text).into_iter().enumerate() {
            let at = |m: &str| FileError::new(&f.name, format!("document {}: {m}", i + 1));
            let parsed = serde_saphyr::from_str::<Option<Value>>(doc)
                .map_err(|e| at(&format!("not valid YAML ({e})")))?;
            let Some(doc) = parsed else { continue };
            let items = match doc.get("kind").and_then(Value::as_str) {
                Some(k) if k.ends_with("List") && doc.get("items").is_some() => {
                    doc["items"].as_array().cloned().unwrap_or_default()
                }
                _ => vec![doc],
            };
            for item in items {
                out.push(object(item).map_err(&at)?);
            }
        }
    }
    Ok(out)
}

/// A document as a manifest, or what it lacks.
fn object(item: Value) -> Result<Manifest, &'static str> {
    if !item.is_object() {
        return Err("not a map: every document must be a Kubernetes object");
    }
    let m = Manifest(item);
    if m.api_version().is_none_or(str::is_empty) || m.kind().is_none_or(str::is_empty) {
        return Err("no apiVersion or kind: every document must be a Kubernetes object");
    }
    if m.name().is_none_or(str::is_empty) {
        return Err("no metadata.name: every object needs a name");
    }
    Ok(m)
}

/// The `version` of the chart in an archive (its top directory's `Chart.yaml`), read within
/// [`MAX_FILE_BYTES`]; `None` when there is none or it cannot be read.
pub fn archive_version(archive: &[u8]) -> Option<String> {
    let gz = flate2::read::GzDecoder::new(archive);
    let mut tar = tar::Archive::new(gz);
    for entry in tar.entries().ok()? {
        let mut entry = entry.ok()?;
        let path = entry.path().ok()?.to_string_lossy().into_owned();
        let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
        if parts.len() != 2 || parts[1] != "Chart.yaml" {
            continue;
        }
        let mut text = String::new();
        entry
            .by_ref()
            .take(MAX_FILE_BYTES)
            .read_to_string(&mut text)
            .ok()?;
        let chart: Value = serde_saphyr::from_str(&text).ok()?;
        return match &chart["version"] {
            Value::String(s) => Some(s.clone()),
            Value::Number(n) => Some(n.to_string()),
            _ => None,
        };
    }
    None
}

/// The YAML documents of a stream, split at `---` lines (helm prints each under its own). What
/// follows `--- ` on its line (a comment, or the start of the document) begins the next one.
pub(crate) fn documents(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut start = 0;
    let mut offset = 0;
    for line in text.split_inclusive('\n') {
        if line.trim_end() == "---" {
            out.push(&text[start..offset]);
            start = offset + line.len();
        } else if line.starts_with("--- ") || line.starts_with("---\t") {
            out.push(&text[start..offset]);
            start = offset + 4;
        }
        offset += line.len();
    }
    out.push(&text[start..]);
    out.into_iter().filter(|d| !d.trim().is_empty()).collect()
}

#[cfg(test)]
mod tests;
