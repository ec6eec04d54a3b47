//! `tender-demo`: the main job on the built-in local environment.
//!
//! Starts a real hub and two downstream clusters on loopback, runs the hub and one agent per
//! cluster (the same library code the `tender-hub` and `tender-agent` binaries run, with their
//! /metrics servers), registers the clusters the way `tender cluster add` does, applies
//! `examples/sources.yaml` and `examples/bundle.yaml`, shows the Secret and ConfigMap arriving
//! downstream before the manifests, rotates the Secret on the hub and times its arrival.
//! Then the Helm step: a local chart repository, `examples/helmop.yaml` (a Fleet-shaped HelmOp
//! whose values come from a copied Secret), the rendered ConfigMap on each cluster, and a
//! rotation of the values Secret re-rendering the chart everywhere.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Parser;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Secret, ServiceAccount};
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::discovery::{Discovery, Scope};
use kube::{Resource, ResourceExt};
use tender_e2e::{EnvOptions, HUB, TestEnv, crds::install_crds, downstream_name};
use tender_runtime::{Health, Metrics};
use tender_types::{Bundle, BundleDeployment, Cluster, HelmOp, conditions, hash, labels};

const WORKSPACE: &str = "tender-default";
const CLUSTERS: [(&str, usize); 2] = [("east", 1), ("west", 2)];

#[derive(Parser)]
#[command(
    about = "tender on a real local hub + 2 downstream clusters: copy, deploy, rotate, and a Helm chart fed by a copied Secret"
)]
struct Args {
    /// Keep everything running after the demo (until Ctrl-C) to poke at it with kubectl.
    #[arg(long)]
    keep_running: bool,
    /// State directory (kubeconfigs, logs); a temporary one when not given.
    #[arg(long)]
    state_dir: Option<PathBuf>,
    /// First port of the metrics servers (hub, then one per agent); 0: any free port each.
    #[arg(long, default_value_t = 9090)]
    metrics_port: u16,
}

fn step(text: &str) {
    println!("\n==> {text}");
}

fn repo_file(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(rel)
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    // kube_client logs every non-2xx at error level, including the /readyz polls at start-up.
    tender_runtime::telemetry::init(tender_runtime::LogFormat::Text, "warn,kube_client=off")?;
    // Every metrics port is bound before anything else runs: the environment's own
    // connections draw local ports, and one could take a port between a check and a late bind.
    let mut listeners = Vec::new();
    for i in 0..=CLUSTERS.len() as u16 {
        let port = if args.metrics_port == 0 {
            0
        } else {
            args.metrics_port + i
        };
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let listener = tokio::net::TcpListener::bind(addr).await.with_context(|| {
            format!(
                "cannot listen on {addr} for metrics: --metrics-port {} and the {} ports after it must be free",
                args.metrics_port,
                CLUSTERS.len()
            )
        })?;
        listeners.push(listener);
    }
    let mut listeners = listeners.into_iter();

    step(
        "Starting the local environment: etcd, a hub and 2 downstream clusters (real kube-apiserver + kube-controller-manager)",
    );
    let started = Instant::now();
    let env = TestEnv::start(EnvOptions {
        downstream: CLUSTERS.len(),
        state_dir: args.state_dir.clone(),
    })
    .await?;
    println!("    ready in {:.1}s", started.elapsed().as_secs_f64());
    for c in env.clusters() {
        println!(
            "    {:<13} {}  kubeconfig {}",
            c.name,
            c.server,
            c.kubeconfig.display()
        );
    }
    let hub = env.client(HUB).await?;

    step(
        "Building the pinned Helm CLI for the agents (first run only: a few minutes, from its Go module; cached in ~/.cache/tender)",
    );
    let started = Instant::now();
    let helm = tender_e2e::ensure_helm()?;
    println!(
        "    {} ({:.1}s)",
        helm.display(),
        started.elapsed().as_secs_f64()
    );

    step("Installing the tender CRDs on the hub and creating workspace tender-default");
    install_crds(&hub).await?;
    apply_yaml(
        &hub,
        &format!("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {WORKSPACE}\n"),
    )
    .await?;

    step("Starting tender-hub (EXPERIMENTAL_COPY_RESOURCES_DOWNSTREAM=true)");
    let mut tasks = Vec::new();
    let hub_listener = listeners.next().expect("one listener per server");
    let hub_addr = hub_listener.local_addr()?;
    tasks.push(start_hub(&env, hub_listener).await?);
    println!("    metrics: http://{hub_addr}/metrics");

    step(
        "Registering clusters east and west (env=prod), as `tender cluster add` does, and starting their agents",
    );
    for (name, n) in CLUSTERS.iter() {
        let reg = tender_cli::cluster::register(
            &hub,
            &env.cluster(HUB).server,
            WORKSPACE,
            name,
            &BTreeMap::from([("env".to_string(), "prod".to_string())]),
            tender_types::namespaces::DEFAULT_AGENT_NAMESPACE,
            Duration::from_secs(60),
            Duration::from_secs(7200),
        )
        .await?;
        let listener = listeners.next().expect("one listener per server");
        let addr = listener.local_addr()?;
        tasks.push(
            start_agent(
                &env,
                &reg.hub_kubeconfig,
                &downstream_name(*n),
                name,
                listener,
                &helm,
            )
            .await?,
        );
        println!(
            "    {name}: hub namespace {}, agent on {}, metrics http://{addr}/metrics",
            reg.cluster_namespace,
            downstream_name(*n)
        );
    }

    step("Applying examples/sources.yaml (a Secret and a ConfigMap) and examples/bundle.yaml");
    apply_yaml(
        &hub,
        &std::fs::read_to_string(repo_file("examples/sources.yaml"))?,
    )
    .await?;
    let applied = Instant::now();
    apply_yaml(
        &hub,
        &std::fs::read_to_string(repo_file("examples/bundle.yaml"))?,
    )
    .await?;

    let secrets: Api<Secret> = Api::namespaced(hub.clone(), WORKSPACE);
    let source = secrets.get("registry-creds").await?;
    let want = source.data.clone().unwrap_or_default();
    for (name, n) in CLUSTERS {
        let down = env.client(&downstream_name(n)).await?;
        let secret = wait_secret_data(&down, &want, Duration::from_secs(90)).await?;
        let cm = wait_for(
            &Api::<ConfigMap>::namespaced(down.clone(), "apps"),
            "app-settings",
        )
        .await?;
        let sa = wait_for(
            &Api::<ServiceAccount>::namespaced(down.clone(), "apps"),
            "puller",
        )
        .await?;
        let wiring = wait_for(
            &Api::<ConfigMap>::namespaced(down.clone(), "apps"),
            "app-wiring",
        )
        .await?;
        println!(
            "    {name} ({}) after {:.1}s: Secret apps/registry-creds (type {}, data digest {}), ConfigMap apps/app-settings ({} keys)",
            downstream_name(n),
            applied.elapsed().as_secs_f64(),
            secret.type_.clone().unwrap_or_default(),
            data_digest(&want),
            cm.data.as_ref().map(|d| d.len()).unwrap_or_default(),
        );
        let copies_first = [rv(&secret), rv(&cm)].into_iter().max().unwrap_or(0)
            < [rv(&sa), rv(&wiring)].into_iter().min().unwrap_or(u64::MAX);
        println!(
            "      copies before manifests: {} (copies resourceVersion < ServiceAccount apps/puller and ConfigMap apps/app-wiring)",
            if copies_first { "yes" } else { "NO" }
        );
        if !copies_first {
            bail!("{name}: a manifest object was created before the copies");
        }
    }

    step("Rotating the Secret on the hub (nobody touches the Bundle)");
    let rotated = Instant::now();
    let mut data = BTreeMap::new();
    data.insert(
        ".dockerconfigjson".to_string(),
        ByteString(br#"{"auths":{"registry.example.com":{"auth":"ZGVtbzpyMHQ0dDNk"}}}"#.to_vec()),
    );
    let patch = serde_json::json!({"data": data});
    let rotated_secret = secrets
        .patch(
            "registry-creds",
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await?;
    let want = rotated_secret.data.clone().unwrap_or_default();
    for (name, n) in CLUSTERS {
        let down = env.client(&downstream_name(n)).await?;
        wait_secret_data(&down, &want, Duration::from_secs(60)).await?;
        println!(
            "    rotation arrived at {name} in {} ms (new data digest {})",
            rotated.elapsed().as_millis(),
            data_digest(&want)
        );
    }

    // Kept until the end: `--keep-running` leaves the chart repository serving.
    let _chart_repo = helm_step(&env, &hub).await?;

    step("Status on the hub (`tender status -n tender-default`)");
    wait_bundle_ready(&hub, "registry-creds").await?;
    wait_bundle_ready(&hub, "web").await?;
    // The HelmOp's status is copied from its Bundle a moment later.
    wait_helm_op_ready(&hub, "web").await?;
    let bundles = Api::<Bundle>::namespaced(hub.clone(), WORKSPACE)
        .list(&Default::default())
        .await?;
    let clusters = Api::<Cluster>::namespaced(hub.clone(), WORKSPACE)
        .list(&Default::default())
        .await?;
    let helm_ops = Api::<HelmOp>::namespaced(hub.clone(), WORKSPACE)
        .list(&Default::default())
        .await?;
    let deployments = Api::<BundleDeployment>::all(hub.clone())
        .list(
            &kube::api::ListParams::default()
                .labels(&tender_cli::status::workspace_selector(WORKSPACE)),
        )
        .await?;
    print!(
        "{}",
        tender_cli::status::render_table(
            &helm_ops.items,
            &bundles.items,
            &clusters.items,
            &deployments.items
        )
    );

    if args.keep_running {
        step("Everything keeps running; Ctrl-C stops it. Try:");
        println!(
            "    kubectl --kubeconfig {} get tender -A",
            env.cluster(HUB).kubeconfig.display()
        );
        println!(
            "    kubectl --kubeconfig {} -n apps get secret,configmap,serviceaccount",
            env.cluster(&downstream_name(1)).kubeconfig.display()
        );
        println!(
            "    kubectl --kubeconfig {} -n web get configmap web-config -o yaml",
            env.cluster(&downstream_name(1)).kubeconfig.display()
        );
        tokio::signal::ctrl_c().await?;
    }
    step("Done: stopping hub, agents and clusters");
    for t in tasks {
        t.abort();
    }
    env.stop();
    Ok(())
}

fn rv<K: Resource>(obj: &K) -> u64 {
    obj.meta()
        .resource_version
        .as_deref()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

async fn start_hub(
    env: &TestEnv,
    listener: tokio::net::TcpListener,
) -> Result<tokio::task::JoinHandle<()>> {
    let mut metrics = Metrics::new();
    let hub_metrics = tender_hub::HubMetrics::register(&mut metrics);
    let metrics = Arc::new(metrics);
    let config = kube_config(&env.kubeconfig_as(HUB, tender_e2e::ADMIN_USER)).await?;
    let client =
        tender_runtime::client::client_from_config(config, Some(metrics.clone()), "tender-hub")?;
    let health = Health::new();
    let server = tender_runtime::server::serve_on(listener, metrics.clone(), health.clone());
    let hub_config = tender_hub::HubConfig {
        copy_resources_downstream: true,
        workspace_namespaces: vec![WORKSPACE.to_string()],
        signing: tender_hub::signing::SigningConfig {
            namespace: WORKSPACE.to_string(),
            ..Default::default()
        },
        ..tender_hub::HubConfig::default()
    };
    Ok(tokio::spawn(async move {
        let run = tender_hub::run(
            client,
            hub_config,
            metrics,
            hub_metrics,
            health,
            std::future::pending(),
        );
        tokio::select! {
            r = run => if let Err(e) = r { eprintln!("tender-hub stopped: {e}") },
            r = server => if let Err(e) = r { eprintln!("tender-hub metrics server: {e}") },
        }
    }))
}

async fn start_agent(
    env: &TestEnv,
    hub_kubeconfig: &str,
    downstream: &str,
    cluster: &str,
    listener: tokio::net::TcpListener,
    helm: &Path,
) -> Result<tokio::task::JoinHandle<()>> {
    let metrics = tender_agent::AgentMetrics::register(Metrics::new());
    let hub = tender_runtime::client::client_from_config(
        kube_config(hub_kubeconfig).await?,
        Some(metrics.shared()),
        "tender-agent",
    )?;
    let down = tender_runtime::client::client_from_config(
        kube_config(&env.kubeconfig_as(downstream, tender_e2e::ADMIN_USER)).await?,
        Some(metrics.shared()),
        "tender-agent",
    )?;
    let health = Health::new();
    let server = tender_runtime::server::serve_on(listener, metrics.shared(), health.clone());
    let signing_keys =
        tender_e2e::hub_harness::hub_signing_keys(&env.client(tender_e2e::HUB).await?, WORKSPACE)
            .await;
    let mut config = tender_agent::AgentConfig::new(WORKSPACE, cluster);
    config.helm_path = helm.to_path_buf();
    config.hub_signing_keys = signing_keys;
    Ok(tokio::spawn(async move {
        let run = tender_agent::run(hub, down, config, metrics, health, std::future::pending());
        tokio::select! {
            r = run => if let Err(e) = r { eprintln!("tender-agent stopped: {e}") },
            r = server => if let Err(e) = r { eprintln!("tender-agent metrics server: {e}") },
        }
    }))
}

async fn kube_config(yaml: &str) -> Result<kube::Config> {
    let kc = kube::config::Kubeconfig::from_yaml(yaml)?;
    Ok(kube::Config::from_custom_kubeconfig(kc, &Default::default()).await?)
}

/// Server-side applies every document of `yaml` (like `kubectl apply --server-side`).
async fn apply_yaml(client: &kube::Client, yaml: &str) -> Result<()> {
    let discovery = Discovery::new(client.clone()).run().await?;
    let pp = PatchParams::apply("tender-demo").force();
    for obj in serde_saphyr::from_multiple::<Option<DynamicObject>>(yaml)?
        .into_iter()
        .flatten()
    {
        let types = obj
            .types
            .clone()
            .context("object without apiVersion/kind")?;
        let gvk = kube::api::GroupVersionKind::try_from(&types)?;
        let (ar, caps) = discovery
            .resolve_gvk(&gvk)
            .with_context(|| format!("{} {} is not served", types.api_version, types.kind))?;
        let api: Api<DynamicObject> = match caps.scope {
            Scope::Namespaced => {
                Api::namespaced_with(client.clone(), &obj.namespace().unwrap_or_default(), &ar)
            }
            Scope::Cluster => Api::all_with(client.clone(), &ar),
        };
        api.patch(&obj.name_any(), &pp, &Patch::Apply(&obj))
            .await
            .with_context(|| format!("applying {} {}", types.kind, obj.name_any()))?;
    }
    Ok(())
}

async fn wait_for<K>(api: &Api<K>, name: &str) -> Result<K>
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        if let Some(o) = api.get_opt(name).await? {
            return Ok(o);
        }
        if Instant::now() > deadline {
            bail!("{name} did not appear downstream");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A short digest of Secret data, so the demo can show which version arrived without
/// printing a Secret value.
fn data_digest(data: &BTreeMap<String, ByteString>) -> String {
    let v = serde_json::to_value(data).unwrap_or_default();
    hash::value_hash(&v)[..12].to_string()
}

/// Waits for apps/registry-creds downstream to carry exactly `want` as its data.
async fn wait_secret_data(
    down: &kube::Client,
    want: &BTreeMap<String, ByteString>,
    timeout: Duration,
) -> Result<Secret> {
    let api: Api<Secret> = Api::namespaced(down.clone(), "apps");
    let started = Instant::now();
    loop {
        if let Some(s) = api.get_opt("registry-creds").await? {
            let managed = s.labels().get(labels::MANAGED_BY).map(String::as_str)
                == Some(labels::MANAGED_BY_VALUE);
            if managed && s.data.as_ref() == Some(want) {
                return Ok(s);
            }
        }
        if started.elapsed() > timeout {
            bail!(
                "the Secret with data digest {} did not arrive downstream in {timeout:?}",
                data_digest(want)
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits (up to 60 s) until Bundle `name` reports Ready.
async fn wait_bundle_ready(hub: &kube::Client, name: &str) -> Result<()> {
    wait_ready(
        Api::<Bundle>::namespaced(hub.clone(), WORKSPACE),
        name,
        |b| {
            b.status
                .as_ref()
                .is_some_and(|s| conditions::is_true(&s.conditions, conditions::TYPE_READY))
        },
    )
    .await
}

/// Waits (up to 60 s) until HelmOp `name` reports Ready with every cluster ready (its status
/// is copied from its Bundle a moment after the Bundle's).
async fn wait_helm_op_ready(hub: &kube::Client, name: &str) -> Result<()> {
    wait_ready(
        Api::<HelmOp>::namespaced(hub.clone(), WORKSPACE),
        name,
        |h| {
            h.status.as_ref().is_some_and(|s| {
                conditions::is_true(&s.conditions, conditions::TYPE_READY)
                    && s.summary
                        .as_ref()
                        .is_some_and(|m| m.desired_ready > 0 && m.ready == m.desired_ready)
            })
        },
    )
    .await
}

/// Polls `name` until `ready` holds, for at most 60 s (the status table shows whatever it is).
async fn wait_ready<K>(api: Api<K>, name: &str, ready: impl Fn(&K) -> bool) -> Result<()>
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if ready(&api.get(name).await?) || Instant::now() > deadline {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Credentials of the demo's chart repository (the ones in `examples/helmop.yaml`).
const CHART_USER: &str = "demo";
const CHART_PASSWORD: &str = "demo-chart-password";
/// The repository URL written in `examples/helmop.yaml`, replaced by the local one.
const EXAMPLE_REPO: &str = "https://charts.example.com";

/// The Helm step: a chart repository on loopback (basic auth), `examples/helmop.yaml` applied
/// with its URL, the rendered ConfigMap on each cluster, then a rotation of the values Secret.
async fn helm_step(env: &TestEnv, hub: &kube::Client) -> Result<tender_e2e::charts::ChartRepo> {
    step(
        "Helm: serving chart `app` from a local chart repository (basic auth) and applying examples/helmop.yaml, a Fleet-shaped HelmOp whose values come from a copied Secret",
    );
    let repo = tender_e2e::charts::ChartRepo::start(&["0.1.0"], CHART_USER, CHART_PASSWORD).await?;
    println!("    chart repository: {}/index.yaml", repo.url);
    let yaml = std::fs::read_to_string(repo_file("examples/helmop.yaml"))?
        .replace(EXAMPLE_REPO, &repo.url);
    let applied = Instant::now();
    apply_yaml(hub, &yaml).await?;
    for (name, n) in CLUSTERS {
        let down = env.client(&downstream_name(n)).await?;
        let greeting = wait_greeting(&down, |g| g == "hello from the hub").await?;
        println!(
            "    helm values arrived at {name} ({}) after {:.1}s: ConfigMap web/web-config rendered by the agent, greeting={greeting:?}",
            downstream_name(n),
            applied.elapsed().as_secs_f64()
        );
    }

    step("Rotating the values Secret web-values on the hub (nobody touches the HelmOp)");
    let rotated = Instant::now();
    let patch = serde_json::json!({"stringData": {"values.yaml": "greeting: hello again\n"}});
    Api::<Secret>::namespaced(hub.clone(), WORKSPACE)
        .patch("web-values", &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    for (name, n) in CLUSTERS {
        let down = env.client(&downstream_name(n)).await?;
        let greeting = wait_greeting(&down, |g| g == "hello again").await?;
        println!(
            "    helm rotation arrived at {name} in {} ms: chart re-rendered, greeting={greeting:?}",
            rotated.elapsed().as_millis()
        );
    }
    Ok(repo)
}

/// Waits for ConfigMap web/web-config downstream to carry a greeting `ok` accepts.
async fn wait_greeting(down: &kube::Client, ok: impl Fn(&str) -> bool) -> Result<String> {
    let api: Api<ConfigMap> = Api::namespaced(down.clone(), "web");
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let greeting = api
            .get_opt("web-config")
            .await?
            .and_then(|c| c.data)
            .and_then(|d| d.get("greeting").cloned());
        if let Some(g) = greeting.filter(|g| ok(g)) {
            return Ok(g);
        }
        if Instant::now() > deadline {
            bail!("ConfigMap web/web-config did not get the expected greeting downstream");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
