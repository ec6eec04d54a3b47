//! Reading a fleet.yaml directory as Fleet does (`GetContent` in Fleet's `loaddirectory.go`):
//! every file, recursively, except dot files and directories, `.fleetignore` patterns, the
//! fleet.yaml itself and the values files; then Fleet's `yaml.overlays` rule.

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::Value;

/// A directory's files by path relative to it (`/`-separated).
pub(crate) type Files = BTreeMap<String, Vec<u8>>;

/// Go's `filepath.Match` on one path element: `*`, `?`, `[...]` (with `^`/`!` and ranges) and
/// `\` escapes.
pub(crate) fn glob(pattern: &str, name: &str) -> bool {
    let p: Vec<char> = pattern.chars().collect();
    let n: Vec<char> = name.chars().collect();
    glob_at(&p, &n)
}

fn glob_at(p: &[char], n: &[char]) -> bool {
    match p.first() {
        None => n.is_empty(),
        Some('*') => (0..=n.len()).any(|i| !n[..i].contains(&'/') && glob_at(&p[1..], &n[i..])),
        Some('?') => n.first().is_some_and(|c| *c != '/') && glob_at(&p[1..], &n[1..]),
        Some('[') => {
            let Some(end) = p.iter().skip(1).position(|c| *c == ']').map(|i| i + 1) else {
                return false;
            };
            let Some(c) = n.first() else { return false };
            let class = &p[1..end];
            let (negate, class) = match class.first() {
                Some('^' | '!') => (true, &class[1..]),
                _ => (false, class),
            };
            let mut hit = false;
            let mut i = 0;
            while i < class.len() {
                if i + 2 < class.len() && class[i + 1] == '-' {
                    hit |= class[i] <= *c && *c <= class[i + 2];
                    i += 3;
                } else {
                    hit |= class[i] == *c;
                    i += 1;
                }
            }
            hit != negate && glob_at(&p[end + 1..], &n[1..])
        }
        Some('\\') if p.len() > 1 => n.first() == Some(&p[1]) && glob_at(&p[2..], &n[1..]),
        Some(c) => n.first() == Some(c) && glob_at(&p[1..], &n[1..]),
    }
}

/// The lines of an ignore file that are patterns (Fleet's `readFleetIgnore`).
fn ignore_patterns(dir: &Path, file: &str) -> Vec<String> {
    std::fs::read_to_string(dir.join(file))
        .map(|text| {
            text.lines()
                .map(|l| l.trim_end().to_string())
                .filter(|l| !l.is_empty() && !l.starts_with('#'))
                .collect()
        })
        .unwrap_or_default()
}

/// Whether `.fleetignore` patterns of any enclosing directory ignore `name` (Fleet matches a
/// pattern against the base name only; `dir/*` ignores directories named `dir`).
fn ignored(patterns: &[Vec<String>], name: &str, is_dir: bool) -> bool {
    patterns
        .iter()
        .flatten()
        .any(|p| match p.strip_suffix("/*") {
            Some(dir) if !dir.is_empty() => is_dir && dir == name,
            _ => glob(p, name),
        })
}

/// Reads `root` as Fleet does, skipping the relative paths in `skip` (fleet.yaml, values
/// files) and their base names at the root. Errors name the file.
pub(crate) fn read_dir(root: &Path, skip: &[String]) -> Result<Files, (String, String)> {
    let mut files = Files::new();
    let mut stack = vec![(String::new(), vec![ignore_patterns(root, ".fleetignore")])];
    while let Some((rel, patterns)) = stack.pop() {
        let dir = root.join(&rel);
        let mut entries: Vec<_> = std::fs::read_dir(&dir)
            .map_err(|e| (display(&rel), e.to_string()))?
            .filter_map(Result::ok)
            .collect();
        entries.sort_by_key(|e| e.file_name());
        for entry in entries {
            let name = entry.file_name().to_string_lossy().into_owned();
            let path = if rel.is_empty() {
                name.clone()
            } else {
                format!("{rel}/{name}")
            };
            let meta =
                std::fs::metadata(entry.path()).map_err(|e| (path.clone(), e.to_string()))?;
            if name.starts_with('.') || ignored(&patterns, &name, meta.is_dir()) {
                continue;
            }
            if meta.is_dir() {
                let mut inner = patterns.clone();
                inner.push(ignore_patterns(&entry.path(), ".fleetignore"));
                stack.push((path, inner));
                continue;
            }
            if skip.contains(&path) {
                continue;
            }
            if entry.file_type().is_ok_and(|t| t.is_symlink()) {
                let target = std::fs::canonicalize(entry.path())
                    .map_err(|e| (path.clone(), e.to_string()))?;
                let base =
                    std::fs::canonicalize(root).map_err(|e| (path.clone(), e.to_string()))?;
                if !target.starts_with(&base) {
                    return Err((
                        path,
                        "a symlink whose target is outside the directory".into(),
                    ));
                }
            }
            let content = std::fs::read(entry.path()).map_err(|e| (path.clone(), e.to_string()))?;
            files.insert(path, content);
        }
    }
    Ok(files)
}

fn display(rel: &str) -> String {
    if rel.is_empty() {
        ".".into()
    } else {
        rel.into()
    }
}

/// Fleet's overlay rule (`internal/helmdeployer/render/patch`): for each overlay in order, a
/// file `overlays/<overlay>/<path>` replaces `<path>`, and `<dir>/<name>_patch.<ext>` patches
/// `<dir>/<name>.<ext>` (a JSON patch when it is a list, else a merge patch); then every file
/// under `overlays/` is dropped.
pub(crate) fn apply_overlays(
    files: &Files,
    overlays: &[String],
) -> Result<Files, (String, String)> {
    let mut out = files.clone();
    for overlay in overlays {
        let prefix = format!("overlays/{overlay}/");
        let layer: Vec<(String, Vec<u8>)> = files
            .iter()
            .filter_map(|(k, v)| k.strip_prefix(&prefix).map(|r| (r.to_string(), v.clone())))
            .collect();
        for (name, bytes) in layer {
            let Some(target) = patch_target(&name) else {
                out.insert(name, bytes);
                continue;
            };
            let source = format!("{prefix}{name}");
            let base = out.get(&target).ok_or_else(|| {
                (
                    source.clone(),
                    format!("patches {target}, which does not exist"),
                )
            })?;
            let patched = patch(base, &bytes).map_err(|e| (source, e))?;
            out.insert(target, patched);
        }
    }
    out.retain(|k, _| !k.starts_with("overlays/"));
    Ok(out)
}

/// `x/name_patch.yaml` → `x/name.yaml`.
fn patch_target(name: &str) -> Option<String> {
    let (dir, base) = match name.rsplit_once('/') {
        Some((d, b)) => (Some(d), b),
        None => (None, name),
    };
    if !base.contains("_patch.") {
        return None;
    }
    let base = base.replacen("_patch.", ".", 1);
    Some(match dir {
        Some(d) => format!("{d}/{base}"),
        None => base,
    })
}

fn parse(bytes: &[u8]) -> Result<Value, String> {
    let text = std::str::from_utf8(bytes).map_err(|_| "not UTF-8".to_string())?;
    serde_saphyr::from_str::<Value>(text).map_err(|e| e.to_string())
}

/// Fleet patches with wrangler's `patch.Apply`: a list is a JSON patch; a map is a strategic
/// merge patch for Kubernetes' own kinds and a merge patch otherwise. tender applies a merge
/// patch, which is the same for a patch holding no list; a map patch holding a list is refused
/// (a strategic merge would merge the list by key, a merge patch replaces it).
fn patch(base: &[u8], patch: &[u8]) -> Result<Vec<u8>, String> {
    let mut doc = parse(base)?;
    let p = parse(patch)?;
    match &p {
        Value::Array(_) => {
            let ops: json_patch::Patch =
                serde_json::from_value(p).map_err(|e| format!("not a JSON patch: {e}"))?;
            json_patch::patch(&mut doc, &ops).map_err(|e| e.to_string())?;
        }
        _ if holds_list(&p) => {
            return Err("a patch holding a list: Fleet applies it as a strategic merge patch (lists merged by key), which tender apply does not implement; write the whole file as an overlay instead".into());
        }
        _ => json_patch::merge(&mut doc, &p),
    }
    serde_json::to_vec(&doc).map_err(|e| e.to_string())
}

fn holds_list(v: &Value) -> bool {
    match v {
        Value::Array(_) => true,
        Value::Object(m) => m.values().any(holds_list),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs_are_go_s() {
        assert!(glob("*.md", "README.md"));
        assert!(!glob("*.md", "README.yaml"));
        assert!(glob("file?.yaml", "file1.yaml"));
        assert!(glob("[a-c]x", "bx"));
        assert!(!glob("[^a-c]x", "bx"));
    }

    #[test]
    fn overlays_replace_and_patch_then_vanish() {
        let files: Files = [
            ("a.yaml", "kind: A\nspec:\n  replicas: 1\n  keep: true\n"),
            ("b.yaml", "kind: B\n"),
            ("overlays/x/a_patch.yaml", "spec:\n  replicas: 3\n"),
            ("overlays/x/b.yaml", "kind: B2\n"),
            ("overlays/y/b.yaml", "kind: B3\n"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.as_bytes().to_vec()))
        .collect();
        let out = apply_overlays(&files, &["x".into()]).unwrap();
        assert_eq!(out.keys().collect::<Vec<_>>(), ["a.yaml", "b.yaml"]);
        let a: Value = serde_json::from_slice(&out["a.yaml"]).unwrap();
        assert_eq!(a["spec"], serde_json::json!({"replicas": 3, "keep": true}));
        assert_eq!(out["b.yaml"], b"kind: B2\n");
        let none = apply_overlays(&files, &[]).unwrap();
        assert_eq!(none["b.yaml"], b"kind: B\n");
        let err = apply_overlays(
            &[("overlays/z/c_patch.yaml".to_string(), b"a: 1".to_vec())].into(),
            &["z".into()],
        )
        .unwrap_err();
        assert_eq!(err.0, "overlays/z/c_patch.yaml");
    }
}
