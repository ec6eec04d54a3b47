//! A hostile chart server (issue 21, decision 0076-bounded-chart-sources): whoever writes a
//! Bundle's `spec.helm` chooses the chart repository, so the agent bounds what one can make it do.
//! Each test deploys a good release first from a loopback repository, then points the Bundle at a
//! hostile version: an oversized archive, a redirect to another origin (a second listener
//! that must see no request), a `values.schema.json` whose `$ref` names a URL (a counting
//! listener that must see no request), and a chart that renders more than the agent reads.
//! Each is reported with its reason on the BundleDeployment, and the deployed release stays.
//! The last test shows the pinned helm, run with the agent's environment, fetching nothing.

use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::Api;
use serde_json::{Value, json};
use tender_e2e::charts::{Route, RouteRepo, index_yaml, package_app_chart, package_chart};
use tender_e2e::fixture::{Agent, Workspace};
use tender_e2e::{downstream_name, ensure_helm, eventually, shared_env, unique_name};
use tender_types::conditions::{TYPE_DEPLOYED, find_condition, reason};

const WAIT: std::time::Duration = tender_e2e::fixture::WAIT;
/// The agent's limits in these tests: small, so the hostile charts stay small too.
const MAX_CHART: u64 = 64 << 10;
const MAX_RENDERED: u64 = 128 << 10;

/// A chart repository on loopback with the good chart `app` 0.1.0 and `versions` (version,
/// archive URL) in its index; the archives of those versions are routed by the test.
struct Hostile {
    repo: RouteRepo,
    helm: PathBuf,
    work: PathBuf,
}

impl Hostile {
    async fn start(versions: &[(&str, &str)]) -> Hostile {
        let helm = ensure_helm().expect("building helm");
        let work = std::env::temp_dir().join(unique_name("tender-hostile-charts"));
        let repo = RouteRepo::start().await.expect("starting the repository");
        package_app_chart(&helm, &work.join("src"), &work.join("out"), "0.1.0").unwrap();
        let good = std::fs::read(work.join("out/app-0.1.0.tgz")).unwrap();
        repo.route("app-0.1.0.tgz", Route::Body(good));
        let mut all = vec![("0.1.0", "app-0.1.0.tgz")];
        all.extend_from_slice(versions);
        repo.route(
            "index.yaml",
            Route::Body(index_yaml("app", &all).into_bytes()),
        );
        Hostile { repo, helm, work }
    }

    /// Packages `app` at `version` with `files` and returns the archive.
    fn chart(&self, version: &str, files: &[(&str, &[u8])]) -> Vec<u8> {
        package_chart(
            &self.helm,
            &self.work.join("src"),
            &self.work.join("out"),
            "app",
            version,
            files,
        )
        .unwrap()
    }
}

impl Drop for Hostile {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.work);
    }
}

/// An agent with the helm binary, its own chart cache and the tests' small limits.
async fn agent(ws: &Workspace, cluster: &str, helm: &Path) -> Agent {
    let cache = std::env::temp_dir().join(unique_name("tender-chart-cache"));
    let helm = helm.to_path_buf();
    ws.agent_configured(cluster, &downstream_name(1), |c| {
        c.helm_path = helm;
        c.chart_cache_dir = cache;
        c.chart_limits.max_chart_bytes = MAX_CHART;
        c.chart_limits.max_rendered_bytes = MAX_RENDERED;
    })
    .await
}

fn bundle(cluster: &str, ns: &str, repo: &str, version: &str) -> Value {
    json!({
        "targets": [{"clusterName": cluster}],
        "defaultNamespace": ns,
        "helm": {
            "chart": "app", "repo": repo, "version": version, "releaseName": "web",
            "values": {"greeting": "hi"},
        },
    })
}

/// Waits for the `Deployed` condition's reason to be `want`; returns its message.
async fn deployed_reason(ws: &Workspace, cluster: &str, want: &str) -> String {
    let api = ws.bds(cluster);
    let last = std::sync::Mutex::new(String::new());
    let found = tokio::time::timeout(
        WAIT,
        eventually(&format!("Deployed reason {want}"), WAIT * 2, || async {
            let bd = api.get_opt("app").await?;
            let deployed = bd
                .and_then(|bd| bd.status)
                .and_then(|s| find_condition(&s.conditions, TYPE_DEPLOYED).cloned());
            *last.lock().unwrap() = format!("{deployed:?}");
            Ok::<_, kube::Error>(deployed.filter(|c| c.reason == want).map(|c| c.message))
        }),
    )
    .await;
    found.unwrap_or_else(|_| {
        panic!(
            "no Deployed reason {want} within {WAIT:?}; last: {}",
            last.lock().unwrap()
        )
    })
}

/// Deploys the good release 0.1.0 (`web-config`, `web-extra`) into a fresh namespace and
/// returns it and its ConfigMaps downstream.
async fn deploy_good(ws: &Workspace, cluster: &str, repo: &str) -> (String, Api<ConfigMap>) {
    let ns = unique_name("hostile");
    let down = ws.downstream(&downstream_name(1)).await;
    let cms: Api<ConfigMap> = Api::namespaced(down, &ns);
    ws.bundle("app", bundle(cluster, &ns, repo, "0.1.0")).await;
    ws.ready(cluster, "app").await;
    (ns, cms)
}

/// The release deployed from 0.1.0 is still there, unchanged.
async fn release_stays(cms: &Api<ConfigMap>, why: &str) {
    let data = cms
        .get("web-config")
        .await
        .unwrap()
        .data
        .unwrap_or_default();
    assert_eq!(
        data.get("greeting").map(String::as_str),
        Some("hi"),
        "{why}"
    );
    assert_eq!(
        data.get("version").map(String::as_str),
        Some("0.1.0"),
        "{why}"
    );
    assert!(cms.get_opt("web-extra").await.unwrap().is_some(), "{why}");
}

/// `n` bytes that gzip cannot shrink (xorshift).
fn incompressible(n: usize) -> Vec<u8> {
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

#[tokio::test]
async fn an_oversized_chart_archive_is_not_read_beyond_the_limit() {
    let server = Hostile::start(&[("0.5.0", "app-0.5.0.tgz")]).await;
    let big = server.chart(
        "0.5.0",
        &[
            ("values.yaml", b"greeting: \"\"\n"),
            ("files/blob.bin", &incompressible(3 * MAX_CHART as usize)),
            (
                "templates/config.yaml",
                b"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: web-config\n",
            ),
        ],
    );
    assert!(
        big.len() as u64 > MAX_CHART,
        "the archive is {} bytes",
        big.len()
    );
    server.repo.route("app-0.5.0.tgz", Route::Body(big));
    let ws = Workspace::new(shared_env(1).await, "hostile-big").await;
    let agent = agent(&ws, "big", &server.helm).await;
    let (ns, cms) = deploy_good(&ws, "big", &server.repo.url).await;

    ws.bundle("app", bundle("big", &ns, &server.repo.url, "0.5.0"))
        .await;
    let msg = deployed_reason(&ws, "big", reason::CHART_TOO_LARGE).await;
    assert!(
        msg.contains("--max-chart-bytes") && msg.contains(&MAX_CHART.to_string()),
        "the message names the limit and the flag: {msg}"
    );
    release_stays(&cms, "ChartTooLarge").await;
    drop(agent);
}

#[tokio::test]
async fn a_redirect_to_another_origin_is_refused_and_never_followed() {
    // 0.1.0 is served through a same-origin redirect (followed as before); 0.8.0 redirects
    // to another listener, which serves a chart that would deploy and must see no request.
    let server = Hostile::start(&[("0.8.0", "app-0.8.0.tgz")]).await;
    let elsewhere = RouteRepo::start().await.unwrap();
    let good = std::fs::read(server.work.join("out/app-0.1.0.tgz")).unwrap();
    server
        .repo
        .route("moved/app-0.1.0.tgz", Route::Body(good.clone()));
    server.repo.route(
        "app-0.1.0.tgz",
        Route::Redirect("/moved/app-0.1.0.tgz".into()),
    );
    elsewhere.route("app-0.8.0.tgz", Route::Body(good));
    server.repo.route(
        "app-0.8.0.tgz",
        Route::Redirect(format!("{}/app-0.8.0.tgz", elsewhere.url)),
    );
    let ws = Workspace::new(shared_env(1).await, "hostile-redirect").await;
    let agent = agent(&ws, "redirect", &server.helm).await;
    let (ns, cms) = deploy_good(&ws, "redirect", &server.repo.url).await;

    ws.bundle("app", bundle("redirect", &ns, &server.repo.url, "0.8.0"))
        .await;
    let msg = deployed_reason(&ws, "redirect", reason::CHART_REDIRECT_REFUSED).await;
    assert!(
        msg.contains(&server.repo.url) && msg.contains(&elsewhere.url),
        "the message names both origins: {msg}"
    );
    assert!(msg.contains("--chart-redirect-hosts"), "{msg}");
    assert_eq!(elsewhere.hits(), 0, "the other origin was never asked");
    release_stays(&cms, "ChartRedirectRefused").await;
    drop(agent);
}

#[tokio::test]
async fn a_values_schema_referring_to_a_url_is_refused_before_helm_fetches_it() {
    let server = Hostile::start(&[("0.6.0", "app-0.6.0.tgz")]).await;
    let listener = RouteRepo::start().await.unwrap();
    listener.route(
        "schema.json",
        Route::Body(br#"{"type": "object"}"#.to_vec()),
    );
    let schema = format!(
        r#"{{"$schema": "http://json-schema.org/draft-07/schema#", "type": "object",
            "properties": {{"greeting": {{"$ref": "{}/schema.json"}}}}}}"#,
        listener.url
    );
    let chart = server.chart(
        "0.6.0",
        &[
            ("values.yaml", b"greeting: \"\"\n"),
            ("values.schema.json", schema.as_bytes()),
            (
                "templates/config.yaml",
                b"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: web-config\n",
            ),
        ],
    );
    server.repo.route("app-0.6.0.tgz", Route::Body(chart));
    let ws = Workspace::new(shared_env(1).await, "hostile-schema").await;
    let agent = agent(&ws, "schema", &server.helm).await;
    let (ns, cms) = deploy_good(&ws, "schema", &server.repo.url).await;

    ws.bundle("app", bundle("schema", &ns, &server.repo.url, "0.6.0"))
        .await;
    let msg = deployed_reason(&ws, "schema", reason::CHART_SCHEMA_REFUSED).await;
    assert!(
        msg.contains("values.schema.json") && msg.contains(&listener.url),
        "the message names the file and the reference: {msg}"
    );
    assert_eq!(listener.hits(), 0, "nothing fetched the schema's $ref");
    release_stays(&cms, "ChartSchemaRefused").await;
    drop(agent);
}

#[tokio::test]
async fn a_chart_rendering_beyond_the_limit_stops_helm() {
    let server = Hostile::start(&[("0.7.0", "app-0.7.0.tgz")]).await;
    let template = format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: web-config\ndata:\n  \
         big: {{{{ repeat {} \"x\" | quote }}}}\n",
        2 * MAX_RENDERED
    );
    let chart = server.chart(
        "0.7.0",
        &[
            ("values.yaml", b"greeting: \"\"\n"),
            ("templates/config.yaml", template.as_bytes()),
        ],
    );
    server.repo.route("app-0.7.0.tgz", Route::Body(chart));
    let ws = Workspace::new(shared_env(1).await, "hostile-loud").await;
    let agent = agent(&ws, "loud", &server.helm).await;
    let (ns, cms) = deploy_good(&ws, "loud", &server.repo.url).await;

    ws.bundle("app", bundle("loud", &ns, &server.repo.url, "0.7.0"))
        .await;
    let msg = deployed_reason(&ws, "loud", reason::RENDERED_TOO_LARGE).await;
    assert!(
        msg.contains("--max-rendered-bytes") && msg.contains(&MAX_RENDERED.to_string()),
        "the message names the limit and the flag: {msg}"
    );
    release_stays(&cms, "RenderedTooLarge").await;
    drop(agent);
}

/// The second fence, on the pinned helm itself: with the agent's environment for helm
/// ([`tender_agent::helm::helm_env`]) a schema reference that passed the agent's check would
/// still fetch nothing. `0.0.0.0` reaches the loopback listener directly but, not being a
/// loopback address, is sent to the proxy (Go proxies every address but loopback ones —
/// which is why the agent refuses such schemas before helm runs, above).
#[tokio::test]
async fn helm_renders_without_network() {
    let helm = ensure_helm().expect("building helm");
    let listener = RouteRepo::start().await.unwrap();
    let port = listener.url.rsplit(':').next().unwrap().to_string();
    let work = std::env::temp_dir().join(unique_name("tender-helm-no-network"));
    let chart = work.join("c");
    std::fs::create_dir_all(chart.join("templates")).unwrap();
    std::fs::write(
        chart.join("Chart.yaml"),
        "apiVersion: v2\nname: c\nversion: 0.1.0\n",
    )
    .unwrap();
    std::fs::write(
        chart.join("templates/cm.yaml"),
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: x\n",
    )
    .unwrap();
    std::fs::write(
        chart.join("values.schema.json"),
        format!(r#"{{"properties": {{"a": {{"$ref": "http://0.0.0.0:{port}/s.json"}}}}}}"#),
    )
    .unwrap();
    let template = |env: Vec<(String, String)>| {
        let (helm, chart) = (helm.clone(), chart.clone());
        async move {
            let out = tokio::process::Command::new(helm)
                .args(["template", "r"])
                .arg(chart)
                .envs(env)
                .output()
                .await
                .unwrap();
            String::from_utf8_lossy(&out.stderr).into_owned()
        }
    };
    // Without the agent's environment helm fetches the reference.
    let stderr = template(Vec::new()).await;
    assert!(listener.hits() > 0, "helm fetched the $ref: {stderr}");
    let before = listener.hits();
    let stderr = template(tender_agent::helm::helm_env(&work)).await;
    assert_eq!(
        listener.hits(),
        before,
        "nothing reached the listener: {stderr}"
    );
    assert!(
        stderr.contains("proxyconnect"),
        "the closed proxy refused it: {stderr}"
    );
    let _ = std::fs::remove_dir_all(&work);
}
