//! A chart's `values.schema.json` files, read before helm runs: a schema that refers outside
//! itself (`$ref`, `$dynamicRef`, `$id` or `$schema` with anything but a `#…` fragment or a
//! json-schema.org meta-schema, which helm carries embedded) would make helm fetch that URL
//! from inside the cluster, so the chart is refused (`ChartSchemaRefused`,
//! decision 0076-bounded-chart-sources). Subcharts count: their directories and the archives in
//! `charts/` are read as well.

use std::cell::Cell;
use std::io::Read;
use std::path::Path;

use serde_json::Value;
use tender_types::conditions::reason;

use super::ChartFailure;

/// Keys whose string value names another document.
const REFERENCE_KEYS: [&str; 5] = ["$ref", "$dynamicRef", "$recursiveRef", "$id", "$schema"];
/// Keys whose content is data, not schema (a `$ref` there refers to nothing).
const DATA_KEYS: [&str; 4] = ["enum", "const", "default", "examples"];
/// Most bytes unpacked from one chart, subcharts included (Helm's own limit).
const MAX_UNPACKED: u64 = 100 << 20;
/// Largest file read from a chart (Helm's own limit).
const MAX_FILE: u64 = 5 << 20;
/// Subcharts nested in subcharts, at most.
const MAX_DEPTH: usize = 8;
/// References quoted in a message, at most.
const MAX_QUOTED: usize = 3;

/// Whether `value` of reference key `key` stays inside the document or names an embedded
/// meta-schema.
pub fn reference_allowed(key: &str, value: &str) -> bool {
    if value.is_empty() || value.starts_with('#') {
        return true;
    }
    key != "$id" && is_meta_schema(value)
}

/// The json-schema.org documents helm's validator (santhosh-tekuri/jsonschema v6, pinned by
/// Helm 3.22) embeds; any other json-schema.org URL would be fetched.
const EMBEDDED: [&str; 20] = [
    "schema",
    "draft-04/schema",
    "draft-06/schema",
    "draft-07/schema",
    "draft/2019-09/schema",
    "draft/2019-09/meta/core",
    "draft/2019-09/meta/applicator",
    "draft/2019-09/meta/validation",
    "draft/2019-09/meta/meta-data",
    "draft/2019-09/meta/format",
    "draft/2019-09/meta/content",
    "draft/2020-12/schema",
    "draft/2020-12/meta/core",
    "draft/2020-12/meta/applicator",
    "draft/2020-12/meta/unevaluated",
    "draft/2020-12/meta/validation",
    "draft/2020-12/meta/meta-data",
    "draft/2020-12/meta/format-annotation",
    "draft/2020-12/meta/format-assertion",
    "draft/2020-12/meta/content",
];

/// Whether `url` (its fragment aside) is a meta-schema helm carries embedded.
fn is_meta_schema(url: &str) -> bool {
    let url = url.split('#').next().unwrap_or_default();
    url.strip_prefix("https://json-schema.org/")
        .or_else(|| url.strip_prefix("http://json-schema.org/"))
        .is_some_and(|path| EMBEDDED.contains(&path))
}

/// Every reference of `schema` that leaves it, as `key value`.
pub fn external_references(schema: &Value) -> Vec<String> {
    let mut out = Vec::new();
    walk(schema, &mut out);
    out
}

fn walk(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Object(m) => {
            for (k, val) in m {
                if let (true, Some(s)) = (REFERENCE_KEYS.contains(&k.as_str()), val.as_str()) {
                    if !reference_allowed(k, s) {
                        out.push(format!("{k} {s:?}"));
                    }
                } else if !DATA_KEYS.contains(&k.as_str()) {
                    walk(val, out);
                }
            }
        }
        Value::Array(a) => a.iter().for_each(|v| walk(v, out)),
        _ => {}
    }
}

/// Reads the chart archive at `path` and refuses it when a `values.schema.json` in it (or in
/// a subchart) refers outside itself.
pub(crate) fn check_archive(path: &Path, chart: &str) -> Result<(), ChartFailure> {
    let file = std::fs::File::open(path).map_err(|e| {
        ChartFailure::new(
            reason::CHART_RENDER_FAILED,
            format!("reading the cached chart {}: {e}", path.display()),
        )
    })?;
    let left = Cell::new(MAX_UNPACKED);
    match scan(file, "", &left, 0) {
        Ok(None) => Ok(()),
        Ok(Some((file, refs))) => {
            let mut quoted: Vec<String> = refs.iter().take(MAX_QUOTED).cloned().collect();
            if refs.len() > MAX_QUOTED {
                quoted.push(format!("and {} more", refs.len() - MAX_QUOTED));
            }
            Err(ChartFailure::new(
                reason::CHART_SCHEMA_REFUSED,
                format!(
                    "chart {chart}: {file} refers outside itself ({}): helm would fetch it from \
                     the cluster's network; only \"#...\" references and the json-schema.org \
                     meta-schemas are allowed",
                    quoted.join(", ")
                ),
            ))
        }
        Err(_) if left.get() == 0 => Err(ChartFailure::new(
            reason::CHART_TOO_LARGE,
            format!("chart {chart}: unpacked, it is larger than {MAX_UNPACKED} bytes"),
        )),
        Err(Scan::FileTooLarge(file)) => Err(ChartFailure::new(
            reason::CHART_TOO_LARGE,
            format!("chart {chart}: {file} is larger than {MAX_FILE} bytes"),
        )),
        Err(Scan::Unreadable(e)) => Err(ChartFailure::new(
            reason::CHART_RENDER_FAILED,
            format!("chart {chart}: the archive cannot be read: {e}"),
        )),
    }
}

enum Scan {
    FileTooLarge(String),
    Unreadable(std::io::Error),
}

impl From<std::io::Error> for Scan {
    fn from(e: std::io::Error) -> Self {
        Scan::Unreadable(e)
    }
}

/// A reader that stops (with an error) once `left` is spent.
struct Counted<'a, R> {
    inner: R,
    left: &'a Cell<u64>,
}

impl<R: Read> Read for Counted<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.left.get() == 0 {
            return Err(std::io::Error::other("unpacked size limit"));
        }
        let max = buf
            .len()
            .min(usize::try_from(self.left.get()).unwrap_or(usize::MAX));
        let n = self.inner.read(&mut buf[..max])?;
        self.left.set(self.left.get() - n as u64);
        Ok(n)
    }
}

/// The first schema file of one (sub)chart archive that refers outside itself, with its
/// offending references; `prefix` names the archive inside its parent.
fn scan(
    archive: impl Read,
    prefix: &str,
    left: &Cell<u64>,
    depth: usize,
) -> Result<Option<(String, Vec<String>)>, Scan> {
    let gz = flate2::read::GzDecoder::new(archive);
    let mut tar = tar::Archive::new(Counted { inner: gz, left });
    for entry in tar.entries()? {
        let mut entry = entry?;
        if !entry.header().entry_type().is_file() {
            continue;
        }
        let name = entry.path()?.to_string_lossy().into_owned();
        let shown = format!("{prefix}{name}");
        let file_name = name.rsplit('/').next().unwrap_or_default();
        let subchart = depth < MAX_DEPTH
            && name
                .rsplit_once('/')
                .is_some_and(|(dir, f)| (dir == "charts" || dir.ends_with("/charts")) && is_tgz(f));
        if file_name != "values.schema.json" && !subchart {
            continue;
        }
        let limit = if subchart { MAX_UNPACKED } else { MAX_FILE };
        if entry.size() > limit {
            return Err(Scan::FileTooLarge(shown));
        }
        let mut bytes = Vec::new();
        entry.read_to_end(&mut bytes)?;
        if subchart {
            if let Some(found) = scan(&bytes[..], &format!("{shown}:"), left, depth + 1)? {
                return Ok(Some(found));
            }
            continue;
        }
        // Not JSON: helm refuses it itself, without fetching anything.
        let Ok(schema) = serde_json::from_slice::<Value>(&bytes) else {
            continue;
        };
        let refs = external_references(&schema);
        if !refs.is_empty() {
            return Ok(Some((shown, refs)));
        }
    }
    Ok(None)
}

fn is_tgz(name: &str) -> bool {
    name.ends_with(".tgz") || name.ends_with(".tar.gz")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn fragments_and_embedded_meta_schemas_are_allowed() {
        for (k, v) in [
            ("$ref", "#/definitions/port"),
            ("$ref", "#"),
            ("$id", "#main"),
            ("$schema", "http://json-schema.org/draft-07/schema#"),
            ("$schema", "https://json-schema.org/draft/2020-12/schema"),
            ("$schema", "http://json-schema.org/draft-04/schema"),
            ("$ref", "https://json-schema.org/draft/2019-09/meta/core"),
            (
                "$ref",
                "http://json-schema.org/draft-07/schema#/definitions/nonNegativeInteger",
            ),
        ] {
            assert!(reference_allowed(k, v), "{k} {v}");
        }
        for (k, v) in [
            ("$ref", "http://10.0.0.1/x.json"),
            ("$ref", "definitions.json#/port"),
            ("$ref", "file:///etc/passwd"),
            ("$schema", "https://evil.example/schema"),
            (
                "$schema",
                "https://json-schema.org.evil.example/draft-07/schema",
            ),
            ("$id", "https://evil.example/values.json"),
            ("$id", "https://json-schema.org/draft-07/schema"),
            ("$dynamicRef", "https://evil.example/x"),
            (
                "$ref",
                "https://json-schema.org/draft/2020-12/meta/not-embedded",
            ),
            ("$schema", "https://json-schema.org/draft-08/schema"),
        ] {
            assert!(!reference_allowed(k, v), "{k} {v}");
        }
    }

    #[test]
    fn references_are_found_anywhere_in_the_schema_but_not_in_data() {
        let schema = json!({
            "$schema": "http://json-schema.org/draft-07/schema#",
            "properties": {
                "port": {"$ref": "#/definitions/port"},
                "tls": {"allOf": [{"$ref": "http://169.254.169.254/latest/meta-data"}]},
                "$ref": {"type": "string"},
                "sample": {"default": {"$ref": "http://ignored/as-data"},
                           "enum": [{"$id": "http://ignored/too"}]}
            },
            "definitions": {"port": {"type": "integer", "$id": "https://evil.example/p"}}
        });
        assert_eq!(
            external_references(&schema),
            [
                "$id \"https://evil.example/p\"",
                "$ref \"http://169.254.169.254/latest/meta-data\""
            ]
        );
    }

    fn tgz(files: &[(&str, &[u8])]) -> Vec<u8> {
        let mut tar = tar::Builder::new(Vec::new());
        for (name, data) in files {
            let mut h = tar::Header::new_gnu();
            h.set_size(data.len() as u64);
            h.set_mode(0o644);
            h.set_cksum();
            tar.append_data(&mut h, name, *data).unwrap();
        }
        let raw = tar.into_inner().unwrap();
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        std::io::Write::write_all(&mut gz, &raw).unwrap();
        gz.finish().unwrap()
    }

    #[test]
    fn a_subchart_archive_inside_the_chart_is_read_too() {
        let bad = br#"{"properties":{"a":{"$ref":"http://127.0.0.1:1/x.json"}}}"#;
        let good = br##"{"properties":{"a":{"$ref":"#/definitions/a"}}}"##;
        let sub = tgz(&[
            ("db/Chart.yaml", b"name: db"),
            ("db/values.schema.json", bad),
        ]);
        let chart = tgz(&[
            ("app/Chart.yaml", b"name: app"),
            ("app/values.schema.json", good),
            ("app/charts/db-1.0.0.tgz", &sub),
        ]);
        let left = Cell::new(MAX_UNPACKED);
        let found = scan(&chart[..], "", &left, 0).ok().flatten().unwrap();
        assert_eq!(found.0, "app/charts/db-1.0.0.tgz:db/values.schema.json");
        assert_eq!(found.1, ["$ref \"http://127.0.0.1:1/x.json\""]);
        let clean = tgz(&[("app/values.schema.json", good)]);
        assert!(
            scan(&clean[..], "", &Cell::new(MAX_UNPACKED), 0)
                .ok()
                .unwrap()
                .is_none()
        );
    }

    #[test]
    fn unpacking_stops_at_the_limit() {
        let big = vec![b' '; 4096];
        let chart = tgz(&[("app/values.schema.json", &big)]);
        let left = Cell::new(1000);
        assert!(scan(&chart[..], "", &left, 0).is_err());
        assert_eq!(left.get(), 0);
    }
}
