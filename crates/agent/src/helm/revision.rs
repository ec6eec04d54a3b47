//! `.Release.Revision` as Helm means it (decision 0088-phased-deploy-and-helm-hooks): `helm
//! template` always renders revision 1, so for a later revision the chart is unpacked (after its
//! size and schema checks) and each template's `.Release.Revision` inside `{{ … }}` is replaced by
//! the number. Subcharts packed as archives inside the chart keep revision 1.

use std::io::Read;
use std::path::{Path, PathBuf};

/// `text` with every `.Release.Revision` (also `$.Release.Revision`, `$root.Release.Revision`)
/// inside a template action replaced by `revision`; `None` when there is none.
pub fn rewrite(text: &str, revision: u32) -> Option<String> {
    const NEEDLE: &str = ".Release.Revision";
    let ident = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    let bytes = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut copied = 0;
    let mut changed = false;
    let mut pos = 0;
    while let Some(open) = text[pos..].find("{{").map(|i| pos + i) {
        let Some(close) = text[open..].find("}}").map(|i| open + i) else {
            break;
        };
        let mut at = open;
        while let Some(found) = text[at..close].find(NEEDLE).map(|i| at + i) {
            let end = found + NEEDLE.len();
            at = end;
            if end < bytes.len() && ident(bytes[end]) {
                continue; // `.Release.RevisionX`
            }
            let mut start = found;
            while start > open && ident(bytes[start - 1]) {
                start -= 1;
            }
            if start > open && bytes[start - 1] == b'$' {
                start -= 1; // `$.Release.Revision`, `$root.Release.Revision`
            } else if start != found || (start > open && bytes[start - 1] == b'.') {
                continue; // `.Values.Release.Revision`: somebody's value
            }
            out.push_str(&text[copied..start]);
            out.push_str(&revision.to_string());
            copied = end;
            changed = true;
        }
        pos = close + 2;
    }
    changed.then(|| {
        out.push_str(&text[copied..]);
        out
    })
}

/// The revision deployment `deployment_id` renders as, from the release recorded with the
/// inventory (`<revision>/<deploymentID>`): the same while that deployment is the recorded
/// one, the next for a new one, 1 for the first.
pub fn next_release(recorded: Option<&str>, deployment_id: &str) -> u32 {
    match recorded.and_then(parse_release) {
        None => 1,
        Some((revision, id)) if id == deployment_id => revision,
        Some((revision, _)) => revision.saturating_add(1),
    }
}

/// The revision of a recorded release (`<revision>/<deploymentID>`).
pub fn recorded_revision(recorded: Option<&str>) -> Option<u32> {
    recorded.and_then(parse_release).map(|(r, _)| r)
}

fn parse_release(s: &str) -> Option<(u32, &str)> {
    let (revision, id) = s.split_once('/')?;
    Some((revision.parse().ok().filter(|r| *r > 0)?, id))
}

/// Whether a file of the archive is a template helm renders (`templates/` of the chart or of
/// an unpacked subchart).
fn is_template(path: &str) -> bool {
    path.split('/').any(|d| d == "templates")
}

/// Unpacks the (already checked) chart archive `archive` into `into` and rewrites its
/// templates for `revision`; the chart directory, or `None` when no template mentions the
/// revision (the archive is rendered as it is).
pub(crate) fn unpack_for_revision(
    archive: &Path,
    into: &Path,
    revision: u32,
) -> std::io::Result<Option<PathBuf>> {
    let file = std::fs::File::open(archive)?;
    let mut tar = tar::Archive::new(flate2::read::GzDecoder::new(file));
    let mut changed = false;
    let mut root: Option<PathBuf> = None;
    std::fs::create_dir_all(into)?;
    for entry in tar.entries()? {
        let mut entry = entry?;
        let path = entry.path()?.into_owned();
        if root.is_none()
            && let Some(first) = path.components().next()
        {
            root = Some(into.join(first.as_os_str()));
        }
        let name = path.to_string_lossy().into_owned();
        if entry.header().entry_type().is_file() && is_template(&name) {
            // `unpack_in` refuses paths leaving `into`; the same check here.
            if path
                .components()
                .any(|c| !matches!(c, std::path::Component::Normal(_)))
            {
                continue;
            }
            let mut bytes = Vec::new();
            entry.read_to_end(&mut bytes)?;
            let rewritten = std::str::from_utf8(&bytes)
                .ok()
                .and_then(|text| rewrite(text, revision));
            changed |= rewritten.is_some();
            let target = into.join(&path);
            if let Some(parent) = target.parent() {
                std::fs::create_dir_all(parent)?;
            }
            std::fs::write(target, rewritten.map(String::into_bytes).unwrap_or(bytes))?;
            continue;
        }
        entry.unpack_in(into)?;
    }
    Ok(if changed { root } else { None })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_revision_is_replaced_in_actions_only() {
        let t = "rev: {{ .Release.Revision }}\nroot: {{ $.Release.Revision | quote }}\n\
                 var: {{ $root.Release.Revision }}\ntext: .Release.Revision\n\
                 value: {{ .Values.Release.Revision }}\nlonger: {{ .Release.RevisionX }}\n";
        assert_eq!(
            rewrite(t, 7).unwrap(),
            "rev: {{ 7 }}\nroot: {{ 7 | quote }}\nvar: {{ 7 }}\ntext: .Release.Revision\n\
             value: {{ .Values.Release.Revision }}\nlonger: {{ .Release.RevisionX }}\n"
        );
        assert_eq!(rewrite("{{ .Release.Name }}", 3), None);
        assert_eq!(
            rewrite("{{- if gt .Release.Revision 1 }}up{{- end }}", 2).unwrap(),
            "{{- if gt 2 1 }}up{{- end }}"
        );
    }

    #[test]
    fn each_new_deployment_is_the_next_revision() {
        assert_eq!(next_release(None, "d1"), 1);
        assert_eq!(next_release(Some("1/d1"), "d1"), 1);
        assert_eq!(next_release(Some("1/d1"), "d2"), 2);
        assert_eq!(next_release(Some("4/d2"), "d2"), 4);
        assert_eq!(next_release(Some("garbage"), "d2"), 1);
        assert_eq!(recorded_revision(Some("4/d2")), Some(4));
        assert_eq!(recorded_revision(Some("0/d2")), None);
    }

    #[test]
    fn an_unpacked_chart_keeps_every_file_and_rewrites_the_revision() {
        let dir = std::env::temp_dir().join(format!("tender-rev-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let archive = dir.join("app.tgz");
        std::fs::create_dir_all(&dir).unwrap();
        let mut tar = tar::Builder::new(flate2::write::GzEncoder::new(
            std::fs::File::create(&archive).unwrap(),
            flate2::Compression::fast(),
        ));
        for (path, text) in [
            ("app/Chart.yaml", "name: app\n"),
            ("app/templates/a.yaml", "rev: {{ .Release.Revision }}\n"),
            ("app/templates/b.yaml", "plain: {{ .Release.Name }}\n"),
        ] {
            let mut header = tar::Header::new_gnu();
            header.set_size(text.len() as u64);
            header.set_mode(0o644);
            header.set_cksum();
            tar.append_data(&mut header, path, text.as_bytes()).unwrap();
        }
        tar.into_inner().unwrap().finish().unwrap();
        let out = dir.join("out");
        let root = unpack_for_revision(&archive, &out, 3).unwrap().unwrap();
        assert_eq!(root, out.join("app"));
        let read = |p: &str| std::fs::read_to_string(root.join(p)).unwrap();
        assert_eq!(read("templates/a.yaml"), "rev: {{ 3 }}\n");
        assert_eq!(read("templates/b.yaml"), "plain: {{ .Release.Name }}\n");
        assert_eq!(read("Chart.yaml"), "name: app\n");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn templates_of_the_chart_and_unpacked_subcharts_are_rewritten() {
        assert!(is_template("app/templates/cm.yaml"));
        assert!(is_template("app/charts/sub/templates/_helpers.tpl"));
        assert!(!is_template("app/values.yaml"));
        assert!(!is_template("app/Chart.yaml"));
    }
}
