//! `helm template` with the values on stdin, without network and with its output bounded, and
//! the pure parts around it: the arguments, the environment, the parsing of its output (hooks
//! skipped) and the redaction of its error message.

use std::path::Path;
use std::process::Stdio;

use serde_json::{Map, Value};
use tender_types::conditions::reason;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::process::Command;

use super::ChartFailure;
use crate::hooks::{self, RenderedChart};

/// Longest helm error message kept in status.
const MAX_MESSAGE: usize = 1024;

/// Arguments of `helm template`: hooks are rendered (tender runs them,
/// decision 0088-phased-deploy-and-helm-hooks), tests are not, CRDs are, `--is-upgrade` once the
/// release was installed, values come from stdin, and the Kubernetes and API versions are the
/// downstream cluster's.
pub fn render_args(
    release: &str,
    namespace: &str,
    upgrade: bool,
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
        "--skip-tests",
        "--include-crds",
        "--values",
        "-",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    if upgrade {
        args.push("--is-upgrade".into());
    }
    if let Some(v) = kube_version {
        args.extend(["--kube-version".into(), v.to_string()]);
    }
    for v in api_versions {
        args.extend(["--api-versions".into(), v.clone()]);
    }
    args
}

/// Where helm runs: its homes (under the chart cache; the pod's root filesystem is
/// read-only) and the most output read from it.
pub(super) struct Sandbox<'a> {
    /// `HELM_CACHE_HOME`, `HELM_CONFIG_HOME` and `HELM_DATA_HOME` live below it.
    pub(super) home: &'a Path,
    /// `--max-rendered-bytes`.
    pub(super) max_rendered_bytes: u64,
}

/// A proxy nobody listens on: the discard port of loopback, which helm reaches for every
/// non-loopback URL, so a chart cannot make it fetch anything
/// (decision 0076-bounded-chart-sources).
const NO_NETWORK_PROXY: &str = "http://127.0.0.1:9";

/// The environment of `helm template`: no network (every proxy variable points at a closed
/// port, `NO_PROXY` cleared) and helm's homes under `home`.
pub fn helm_env(home: &Path) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = [
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "ALL_PROXY",
        "http_proxy",
        "https_proxy",
        "all_proxy",
    ]
    .iter()
    .map(|k| (k.to_string(), NO_NETWORK_PROXY.to_string()))
    .collect();
    env.extend(["NO_PROXY", "no_proxy"].map(|k| (k.to_string(), String::new())));
    for (k, dir) in [
        ("HELM_CACHE_HOME", "cache"),
        ("HELM_CONFIG_HOME", "config"),
        ("HELM_DATA_HOME", "data"),
    ] {
        env.push((
            k.to_string(),
            home.join(".helm").join(dir).to_string_lossy().into_owned(),
        ));
    }
    env
}

/// Runs `helm template`; the values are written to its stdin, never to disk. Its output is
/// read as it comes and helm is killed once it passes `sandbox.max_rendered_bytes`.
#[allow(clippy::too_many_arguments)]
pub(super) async fn template(
    helm: &Path,
    sandbox: &Sandbox<'_>,
    release: &str,
    namespace: &str,
    upgrade: bool,
    chart: &Path,
    kube_version: Option<&str>,
    api_versions: &[String],
    values: &Map<String, Value>,
) -> Result<RenderedChart, ChartFailure> {
    let args = render_args(
        release,
        namespace,
        upgrade,
        chart,
        kube_version,
        api_versions,
    );
    let mut child = Command::new(helm)
        .args(&args)
        .envs(helm_env(sandbox.home))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
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
    let stdin = child.stdin.take();
    // Stdin and stderr on their own tasks: whatever helm does with them, stdout is read until
    // its end or the limit, and helm is killed at the limit.
    let feed = tokio::spawn(async move {
        if let Some(mut stdin) = stdin {
            // A helm that exits early closes stdin; its exit status tells why.
            let _ = stdin.write_all(&input).await;
        }
    });
    let stderr = child.stderr.take();
    let errors = tokio::spawn(async move {
        match stderr {
            Some(s) => read_head(s, MAX_STDERR).await,
            None => Ok(Vec::new()),
        }
    });
    let limit = sandbox.max_rendered_bytes;
    let out = match child.stdout.take() {
        Some(s) => read_bounded(s, limit).await,
        None => Ok(Some(Vec::new())),
    };
    let failed = |e: std::io::Error| {
        ChartFailure::new(
            reason::CHART_RENDER_FAILED,
            format!("reading helm's output: {e}"),
        )
    };
    let stdout = match out {
        Ok(Some(stdout)) => stdout,
        stopped => {
            let _ = child.kill().await;
            feed.abort();
            errors.abort();
            stopped.map_err(failed)?;
            return Err(ChartFailure::new(
                reason::RENDERED_TOO_LARGE,
                format!(
                    "helm template printed more than {limit} bytes (agent flag \
                     --max-rendered-bytes); helm was stopped"
                ),
            ));
        }
    };
    let _ = feed.await;
    let err = errors.await.unwrap_or_else(|_| Ok(Vec::new()));
    let stderr = err.map_err(failed)?;
    let status = child.wait().await.map_err(|e| {
        ChartFailure::new(
            reason::CHART_RENDER_FAILED,
            format!("waiting for helm: {e}"),
        )
    })?;
    if !status.success() {
        let stderr = String::from_utf8_lossy(&stderr);
        return Err(ChartFailure::new(
            reason::CHART_RENDER_FAILED,
            redact(stderr.trim(), values),
        ));
    }
    let text = String::from_utf8_lossy(&stdout);
    parse_rendered(&text).map_err(|m| ChartFailure::new(reason::CHART_RENDER_FAILED, m))
}

/// Most of helm's stderr read (the message is cut to [`MAX_MESSAGE`] anyway).
const MAX_STDERR: u64 = 64 << 10;

/// The first `limit` bytes of `r`; the rest is read and dropped (helm never blocks on it).
async fn read_head(r: impl tokio::io::AsyncRead + Unpin, limit: u64) -> std::io::Result<Vec<u8>> {
    let mut buf = Vec::new();
    let mut head = r.take(limit);
    head.read_to_end(&mut buf).await?;
    tokio::io::copy(&mut head.into_inner(), &mut tokio::io::sink()).await?;
    Ok(buf)
}

/// Reads `r` to its end; `None` as soon as it yields more than `limit` bytes (the rest is not
/// read, so memory stays bounded by the limit).
async fn read_bounded(
    r: impl tokio::io::AsyncRead + Unpin,
    limit: u64,
) -> std::io::Result<Option<Vec<u8>>> {
    let mut buf = Vec::new();
    let read = r
        .take(limit.saturating_add(1))
        .read_to_end(&mut buf)
        .await?;
    Ok((read as u64 <= limit).then_some(buf))
}

/// The objects of `helm template` output, split into CRDs from `crds/`, ordinary objects and
/// hooks ([`hooks::split`]): empty documents dropped, `List`s flattened, each document's
/// `# Source:` path kept for the split.
///
/// A `# Source:` line holds for the documents after it until the next one: Helm prints a
/// `crds/` file whole under one `---\n# Source: <file>` header, so a file that starts with
/// `---` (controller-gen's output) or holds several CRDs yields documents without a Source
/// line of their own — taken for ordinary objects they would be deleted with the Bundle, and
/// every custom resource of their kinds with them.
pub fn parse_rendered(text: &str) -> Result<RenderedChart, String> {
    let mut docs = Vec::new();
    let mut source: Option<String> = None;
    for chunk in crate::files::documents(text) {
        if let Some(s) = chunk.lines().find_map(|l| l.strip_prefix("# Source: ")) {
            source = Some(s.trim().to_string());
        }
        let parsed = serde_saphyr::from_str::<Option<Value>>(chunk)
            .map_err(|_| "the chart rendered invalid YAML".to_string())?;
        let Some(doc) = parsed else { continue };
        let items = match doc.get("kind").and_then(Value::as_str) {
            Some(k) if k.ends_with("List") && doc.get("items").is_some() => {
                doc["items"].as_array().cloned().unwrap_or_default()
            }
            _ => vec![doc],
        };
        docs.extend(
            items
                .into_iter()
                .filter(Value::is_object)
                .map(|item| (source.clone(), item)),
        );
    }
    Ok(hooks::split(docs))
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
    fn args_pin_versions_render_hooks_and_read_values_from_stdin() {
        let args = render_args(
            "web",
            "apps",
            true,
            Path::new("/c/app-1.0.0.tgz"),
            Some("v1.36.3"),
            &["v1".into(), "apps/v1".into()],
        );
        assert_eq!(
            args.join(" "),
            "template web /c/app-1.0.0.tgz --namespace apps --skip-tests \
             --include-crds --values - --is-upgrade --kube-version v1.36.3 --api-versions v1 \
             --api-versions apps/v1"
        );
    }

    #[test]
    fn helm_runs_without_network_and_with_its_homes_under_the_cache() {
        let env: std::collections::BTreeMap<_, _> =
            helm_env(Path::new("/cache")).into_iter().collect();
        for k in ["HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "https_proxy"] {
            assert_eq!(env[k], "http://127.0.0.1:9", "{k}");
        }
        assert_eq!(env["NO_PROXY"], "");
        assert_eq!(env["no_proxy"], "");
        assert_eq!(env["HELM_CACHE_HOME"], "/cache/.helm/cache");
        assert_eq!(env["HELM_CONFIG_HOME"], "/cache/.helm/config");
        assert_eq!(env["HELM_DATA_HOME"], "/cache/.helm/data");
    }

    #[tokio::test]
    async fn output_beyond_the_limit_is_not_read() {
        let data = [b'x'; 100];
        assert_eq!(
            read_bounded(&data[..], 100).await.unwrap().map(|b| b.len()),
            Some(100)
        );
        assert_eq!(read_bounded(&data[..], 99).await.unwrap(), None);
    }

    #[test]
    fn output_drops_empty_documents_and_keeps_hooks_apart() {
        let text = "---\n# Source: app/templates/empty.yaml\n---\n# Source: app/templates/cm.yaml\n\
            apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: a\ndata:\n  k: v\n---\n\
            apiVersion: batch/v1\nkind: Job\nmetadata:\n  name: migrate\n  annotations:\n    \
            helm.sh/hook: pre-install\n---\napiVersion: v1\nkind: ConfigMapList\nitems:\n- \
            apiVersion: v1\n  kind: ConfigMap\n  metadata:\n    name: b\n";
        let got = parse_rendered(text).unwrap();
        let names: Vec<_> = got.objects.iter().map(|m| m.name().unwrap()).collect();
        assert_eq!(names, ["a", "b"]);
        assert_eq!(got.objects[0].0["data"], json!({"k": "v"}));
        assert_eq!(got.hooks.len(), 1);
        assert_eq!(got.hooks[0].manifest.name(), Some("migrate"));
    }

    fn crd(name: &str) -> String {
        format!(
            "apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\nmetadata:\n  \
             name: {name}\nspec:\n  group: x.io\n"
        )
    }

    fn crd_names(chart: &RenderedChart) -> Vec<&str> {
        chart.crds.iter().map(|m| m.name().unwrap()).collect()
    }

    /// Helm prints each `crds/` file as `---\n# Source: <file>\n<file>\n`, the file whole:
    /// a file that starts with `---` puts its Source line in a block of its own.
    #[test]
    fn crds_files_that_start_with_a_separator_stay_crds() {
        let text = format!(
            "---\n# Source: app/crds/widgets.yaml\n---\n{}---\n{}\n\
             ---\n# Source: app/crds/plain.yaml\n{}\n\
             ---\n# Source: app/templates/cm.yaml\napiVersion: v1\nkind: ConfigMap\n\
             metadata:\n  name: a\n",
            crd("widgets.x.io"),
            crd("gadgets.x.io"),
            crd("plain.x.io")
        );
        let got = parse_rendered(&text).unwrap();
        assert_eq!(
            crd_names(&got),
            ["widgets.x.io", "gadgets.x.io", "plain.x.io"]
        );
        let names: Vec<_> = got.objects.iter().map(|m| m.name().unwrap()).collect();
        assert_eq!(names, ["a"], "only the template is an ordinary object");
    }

    #[test]
    fn crds_files_with_comments_and_separators_with_comments_stay_crds() {
        let text = format!(
            "---\n# Source: app/crds/all.yaml\n# Copyright the authors.\n# License: Apache-2.0\n\
             --- # the first CRD\n{}\n---\n# only a comment\n---\n\n{}---\n\
             ---\n# Source: app/crds/inline.yaml\n--- {}\n\
             ---\n# Source: app/templates/crd.yaml\n{}",
            crd("a.x.io"),
            crd("b.x.io"),
            "{apiVersion: apiextensions.k8s.io/v1, kind: CustomResourceDefinition, \
             metadata: {name: c.x.io}}",
            crd("templated.x.io")
        );
        let got = parse_rendered(&text).unwrap();
        assert_eq!(crd_names(&got), ["a.x.io", "b.x.io", "c.x.io"]);
        let names: Vec<_> = got.objects.iter().map(|m| m.name().unwrap()).collect();
        assert_eq!(
            names,
            ["templated.x.io"],
            "a templates/ CRD is an ordinary object"
        );
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
