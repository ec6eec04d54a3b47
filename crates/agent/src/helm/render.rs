//! `helm template` with the values on stdin, and the pure parts around it: the arguments, the
//! parsing of its output (hooks skipped) and the redaction of its error message.

use std::path::Path;
use std::process::Stdio;

use serde_json::{Map, Value};
use tender_types::Manifest;
use tender_types::conditions::reason;
use tokio::io::AsyncWriteExt;
use tokio::process::Command;

use super::ChartFailure;

/// Longest helm error message kept in status.
const MAX_MESSAGE: usize = 1024;

/// Arguments of `helm template`: hooks and tests are not rendered (tender does not run them),
/// CRDs are, values come from stdin, and the Kubernetes and API versions are the downstream
/// cluster's.
pub fn render_args(
    release: &str,
    namespace: &str,
    chart: &Path,
    kube_version: Option<&str>,
    api_versions: &[String],
) -> Vec<String> {
    let mut args: Vec<String> = [
        "template",
        release,
        &chart.to_string_lossy(),
        "--namespace",
        namespace,
        "--no-hooks",
        "--skip-tests",
        "--include-crds",
        "--values",
        "-",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    if let Some(v) = kube_version {
        args.extend(["--kube-version".into(), v.to_string()]);
    }
    for v in api_versions {
        args.extend(["--api-versions".into(), v.clone()]);
    }
    args
}

/// Runs `helm template`; the values are written to its stdin, never to disk.
pub(super) async fn template(
    helm: &Path,
    release: &str,
    namespace: &str,
    chart: &Path,
    kube_version: Option<&str>,
    api_versions: &[String],
    values: &Map<String, Value>,
) -> Result<Vec<Manifest>, ChartFailure> {
    let args = render_args(release, namespace, chart, kube_version, api_versions);
    let mut child = Command::new(helm)
        .args(&args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        // No repository config or cache of helm's own: the chart is a local file.
        .env(
            "HELM_CACHE_HOME",
            std::env::temp_dir().join("tender-helm-cache"),
        )
        .spawn()
        .map_err(|e| {
            ChartFailure::new(
                reason::CHART_RENDER_FAILED,
                format!(
                    "cannot run helm at {} (agent flag --helm-path): {e}",
                    helm.display()
                ),
            )
        })?;
    let input = serde_json::to_vec(values).expect("values serialize");
    if let Some(mut stdin) = child.stdin.take() {
        // A helm that exits early closes stdin; its exit status tells why.
        let _ = stdin.write_all(&input).await;
    }
    let out = child.wait_with_output().await.map_err(|e| {
        ChartFailure::new(
            reason::CHART_RENDER_FAILED,
            format!("waiting for helm: {e}"),
        )
    })?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        return Err(ChartFailure::new(
            reason::CHART_RENDER_FAILED,
            redact(stderr.trim(), values),
        ));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    parse_rendered(&text).map_err(|m| ChartFailure::new(reason::CHART_RENDER_FAILED, m))
}

/// The objects of `helm template` output: empty documents dropped, hook objects (annotation
/// `helm.sh/hook`) skipped, `List`s flattened.
pub fn parse_rendered(text: &str) -> Result<Vec<Manifest>, String> {
    let docs = serde_saphyr::from_multiple::<Option<Value>>(text)
        .map_err(|_| "the chart rendered invalid YAML".to_string())?;
    let mut out = Vec::new();
    for doc in docs.into_iter().flatten() {
        let items = match doc.get("kind").and_then(Value::as_str) {
            Some(k) if k.ends_with("List") && doc.get("items").is_some() => {
                doc["items"].as_array().cloned().unwrap_or_default()
            }
            _ => vec![doc],
        };
        for item in items {
            if !item.is_object() {
                continue;
            }
            if item["metadata"]["annotations"]
                .get("helm.sh/hook")
                .is_some()
            {
                continue;
            }
            out.push(Manifest(item));
        }
    }
    Ok(out)
}

/// Helm's message with every string of the values (4 characters or more) replaced, trimmed.
pub fn redact(message: &str, values: &Map<String, Value>) -> String {
    let mut secrets = Vec::new();
    collect_strings(&Value::Object(values.clone()), &mut secrets);
    secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
    let mut out = message.to_string();
    for s in secrets.iter().filter(|s| s.len() >= 4) {
        out = out.replace(s.as_str(), "[redacted]");
    }
    let out = out.strip_prefix("Error: ").unwrap_or(&out).to_string();
    if out.len() > MAX_MESSAGE {
        let mut end = MAX_MESSAGE;
        while !out.is_char_boundary(end) {
            end -= 1;
        }
        format!("{}…", &out[..end])
    } else {
        out
    }
}

fn collect_strings(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::String(s) => out.push(s.clone()),
        Value::Number(n) => out.push(n.to_string()),
        Value::Array(a) => a.iter().for_each(|v| collect_strings(v, out)),
        Value::Object(m) => m.values().for_each(|v| collect_strings(v, out)),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn args_pin_versions_skip_hooks_and_read_values_from_stdin() {
        let args = render_args(
            "web",
            "apps",
            Path::new("/c/app-1.0.0.tgz"),
            Some("v1.36.3"),
            &["v1".into(), "apps/v1".into()],
        );
        assert_eq!(
            args.join(" "),
            "template web /c/app-1.0.0.tgz --namespace apps --no-hooks --skip-tests \
             --include-crds --values - --kube-version v1.36.3 --api-versions v1 \
             --api-versions apps/v1"
        );
    }

    #[test]
    fn output_drops_empty_documents_and_hooks() {
        let text = "---\n# Source: app/templates/empty.yaml\n---\n# Source: app/templates/cm.yaml\n\
            apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: a\ndata:\n  k: v\n---\n\
            apiVersion: batch/v1\nkind: Job\nmetadata:\n  name: migrate\n  annotations:\n    \
            helm.sh/hook: pre-install\n---\napiVersion: v1\nkind: ConfigMapList\nitems:\n- \
            apiVersion: v1\n  kind: ConfigMap\n  metadata:\n    name: b\n";
        let got = parse_rendered(text).unwrap();
        let names: Vec<_> = got.iter().map(|m| m.name().unwrap()).collect();
        assert_eq!(names, ["a", "b"]);
        assert_eq!(got[0].0["data"], json!({"k": "v"}));
    }

    #[test]
    fn errors_do_not_quote_values() {
        let values = json!({"db": {"password": "hunter22", "port": 5432}, "x": "ab"});
        let msg =
            "Error: template: app/templates/s.yaml:3:5: executing: \"hunter22\" is bad, 5432 too";
        let got = redact(msg, values.as_object().unwrap());
        assert_eq!(
            got,
            "template: app/templates/s.yaml:3:5: executing: \"[redacted]\" is bad, [redacted] too"
        );
    }
}
