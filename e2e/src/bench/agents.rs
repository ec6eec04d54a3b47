//! `--agents N`: N Cluster registrations with N in-process agents (`tender_agent::run`, each
//! with its own narrow hub identity and its own agent namespace), spread over the two
//! downstream clusters of a hub + 2 environment and deployed to by ⌈N/100⌉ Bundles (one target
//! and one downstream namespace per cluster; the CRD allows 100 targets), then rotations of a copied Secret with the
//! end-to-end latency from the source write to each downstream copy observed changed, beside a
//! minimal relay in the same run (one fan-out task writing N hub copies, one task per cluster
//! watching its hub copy and applying it downstream), then the same relay reporting: after each
//! downstream apply it also writes one status per cluster, what tender's agents reported, into
//! a custom resource of the BundleDeployment schema (the one write per cluster and rotation
//! tender keeps, issue 26).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use futures::{StreamExt, stream};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret};
use kube::Client;
use kube::api::{Api, ApiResource, DynamicObject, ObjectMeta, Patch, PatchParams, PostParams};
use kube::core::GroupVersionKind;
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::{Value, json};
use tender_e2e::agent_harness::{AgentHandle, start_agent};
use tender_e2e::hub_harness::{WRITE_VERBS, agent_kubeconfig, hub_config, series_of, start_hub};
use tender_e2e::{EnvOptions, HUB, TestEnv, crds::install_crds, downstream_name};
use tender_types::{
    Bundle, BundleDeployment, BundleSpec, BundleTarget, Cluster, ClusterSpec, DownstreamResource,
};
use tokio::task::JoinHandle;

use crate::status_moves::{self, LeaseGaps, StatusMoves};
use crate::{
    Args, BUNDLE, Pids, WORKSPACE, config_map, cpu_now, mem_mb, own_rss_mb, secret, wait_all,
};

const IN_FLIGHT: usize = 16;
const RELAY_MANAGER: &str = "tender-bench-relay";
const RELAY_SOURCE: &str = "relay-src";

/// When each downstream copy (`downstream/namespace`) was first seen at each version.
pub(crate) type Seen = Arc<Mutex<HashMap<String, BTreeMap<u32, Instant>>>>;

/// The rotation number a copy carries (`payload` starts with `rotation <v> `).
pub(crate) fn version(s: &Secret) -> Option<u32> {
    let data = s.data.as_ref()?.get("password")?;
    let text = std::str::from_utf8(&data.0).ok()?;
    text.strip_prefix("rotation ")?
        .split(' ')
        .next()?
        .parse()
        .ok()
}

/// Watches Secrets named `name` in every namespace of `client`'s cluster and records when
/// each version of each copy is first seen.
pub(crate) fn observe(
    client: Client,
    downstream: String,
    name: &str,
    seen: Seen,
) -> JoinHandle<()> {
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    observe_where(client, downstream, config, seen)
}

/// Like [`observe`], for the Secrets `config` selects, keyed `<prefix>/<namespace>`.
pub(crate) fn observe_where(
    client: Client,
    downstream: String,
    config: watcher::Config,
    seen: Seen,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut events = watcher(Api::<Secret>::all(client), config)
            .default_backoff()
            .boxed();
        while let Some(event) = events.next().await {
            let now = Instant::now();
            let s = match event {
                Ok(watcher::Event::Apply(s) | watcher::Event::InitApply(s)) => s,
                _ => continue,
            };
            let (Some(v), Some(ns)) = (version(&s), s.metadata.namespace.as_ref()) else {
                continue;
            };
            let mut seen = seen.lock().expect("seen lock");
            let entry = seen.entry(format!("{downstream}/{ns}")).or_default();
            entry.entry(v).or_insert(now);
        }
    })
}

/// Waits until every key in `keys` has been seen at version `v`; returns the latencies in ms
/// from `start` and the keys still missing at the deadline.
pub(crate) async fn wait_version(
    seen: &Seen,
    keys: &[String],
    v: u32,
    start: Instant,
    timeout: Duration,
) -> (Vec<f64>, usize) {
    let deadline = start + timeout;
    loop {
        let (lat, missing) = {
            let seen = seen.lock().expect("seen lock");
            let mut lat = Vec::with_capacity(keys.len());
            for k in keys {
                // A later version seen first also proves this one was overtaken; count it.
                let first = seen
                    .get(k)
                    .and_then(|m| m.range(v..).map(|(_, t)| *t).min());
                if let Some(t) = first {
                    lat.push(t.saturating_duration_since(start).as_secs_f64() * 1000.0);
                }
            }
            let missing = keys.len() - lat.len();
            (lat, missing)
        };
        if missing == 0 || Instant::now() > deadline {
            return (lat, missing);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Requests so far by "verb resource[/subresource]", summed over the hub or every agent
/// (each agent counts its hub and downstream requests in one registry).
fn requests(registries: impl Iterator<Item = String>) -> BTreeMap<String, u64> {
    by_request(registries, "kube_requests_total")
}

/// Requests sent and not answered yet, keyed like [`requests`] (`kube_requests_in_flight`).
fn in_flight(registries: impl Iterator<Item = String>) -> BTreeMap<String, u64> {
    by_request(registries, "kube_requests_in_flight")
}

/// `family`'s series summed over `registries`, by "verb resource[/subresource]".
fn by_request(registries: impl Iterator<Item = String>, family: &str) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for text in registries {
        for (verb, res, sub, n) in series_of(&text, family) {
            let key = if sub.is_empty() {
                format!("{verb} {res}")
            } else {
                format!("{verb} {res}/{sub}")
            };
            *out.entry(key).or_default() += n;
        }
    }
    out
}

/// The writes among `requests` (as keyed by [`requests`]) that are not heartbeats: Lease
/// renewals, and for agents the `status.agent` report on their Cluster.
fn non_heartbeat_writes(requests: &BTreeMap<String, u64>, agents: bool) -> BTreeMap<String, u64> {
    requests
        .iter()
        .filter(|(k, _)| {
            let (verb, resource) = k.split_once(' ').unwrap_or((k.as_str(), ""));
            WRITE_VERBS.contains(&verb)
                && resource != "leases"
                && !(agents && resource == "clusters/status")
        })
        .map(|(k, n)| (k.clone(), *n))
        .collect()
}

/// `after - before`, non-zero entries only.
fn delta(before: &BTreeMap<String, u64>, after: &BTreeMap<String, u64>) -> BTreeMap<String, u64> {
    after
        .iter()
        .map(|(k, n)| (k.clone(), n - before.get(k).copied().unwrap_or(0)))
        .filter(|(_, n)| *n > 0)
        .collect()
}

/// p50/p95/p99/max of latencies in ms.
pub(crate) fn percentiles(mut v: Vec<f64>) -> Value {
    if v.is_empty() {
        return json!(null);
    }
    v.sort_by(f64::total_cmp);
    let at = |q: f64| v[((v.len() as f64 * q).ceil() as usize).clamp(1, v.len()) - 1];
    json!({"samples": v.len(), "p50_ms": at(0.50), "p95_ms": at(0.95), "p99_ms": at(0.99),
           "max_ms": v[v.len() - 1]})
}

pub(crate) fn show(what: &str, p: &Value) {
    println!(
        "  {what:<6} latency over {} copies: p50 {:.0} ms, p95 {:.0} ms, p99 {:.0} ms, max {:.0} ms",
        p["samples"],
        p["p50_ms"].as_f64().unwrap_or(0.0),
        p["p95_ms"].as_f64().unwrap_or(0.0),
        p["p99_ms"].as_f64().unwrap_or(0.0),
        p["max_ms"].as_f64().unwrap_or(0.0)
    );
}

/// How long a rotation's hub copies may trail its downstream ones in the figures (never:
/// a downstream copy is made from its hub copy; this only bounds a lagging observer).
const HUB_LAG: Duration = Duration::from_secs(5);

/// The hub's part of a rotation: from the source write to each hub copy seen changed.
fn show_hub(what: &str, p: &Value) {
    println!(
        "  {what:<6} hub copies written: p50 {:.0} ms, p95 {:.0} ms, p99 {:.0} ms, max {:.0} ms",
        p["p50_ms"].as_f64().unwrap_or(0.0),
        p["p95_ms"].as_f64().unwrap_or(0.0),
        p["p99_ms"].as_f64().unwrap_or(0.0),
        p["max_ms"].as_f64().unwrap_or(0.0)
    );
}

pub(crate) fn cluster_name(i: usize) -> String {
    format!("c-{i:05}")
}

/// Downstream cluster of cluster `i`: alternately downstream-1 and downstream-2.
pub(crate) fn downstream_of(i: usize) -> String {
    downstream_name(i % 2 + 1)
}

pub(crate) async fn create_namespaces(client: &Client, names: Vec<String>) -> Result<()> {
    let api: Api<Namespace> = Api::all(client.clone());
    let creates = names.into_iter().map(|name| {
        let api = api.clone();
        async move {
            let ns = Namespace {
                metadata: ObjectMeta {
                    name: Some(name),
                    ..Default::default()
                },
                ..Default::default()
            };
            match api.create(&PostParams::default(), &ns).await {
                Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
                r => r.map(|_| ()),
            }
        }
    });
    let results: Vec<_> = stream::iter(creates)
        .buffer_unordered(IN_FLIGHT)
        .collect()
        .await;
    results.into_iter().collect::<kube::Result<Vec<()>>>()?;
    Ok(())
}

/// What a reporting relay writes after each downstream apply: the status of `relay-<i>/creds`,
/// a custom resource of tender's BundleDeployment schema under the bench group, holding
/// `status` (a BundleDeployment status tender's agents wrote in the same run) with
/// `appliedCopiesID` and the `Deployed` message moved to the copy's version: the one write per
/// cluster and rotation issue 26 keeps, as tender's agent makes it.
struct Report {
    resource: ApiResource,
    status: Value,
}

/// The status `report` holds for the hub copy at resourceVersion `version`.
fn report_body(report: &Report, version: &str) -> Value {
    let mut status = report.status.clone();
    status["appliedCopiesID"] = json!(format!("relay-{version}"));
    if let Some(conditions) = status["conditions"].as_array_mut() {
        for c in conditions.iter_mut().filter(|c| c["type"] == "Deployed") {
            c["message"] = json!(format!("deployment relay-{version} applied downstream"));
        }
    }
    json!({
        "apiVersion": report.resource.api_version, "kind": report.resource.kind,
        "metadata": {"name": "creds"}, "status": status,
    })
}

/// The relay: a fan-out task that writes the source's data into `relay-<i>/creds` on the hub
/// for every cluster whenever the source changes, and one task per cluster that applies its
/// hub copy to `relay-<i>/creds` downstream (and, with `report`, then writes its status).
fn start_relay(
    hub: Client,
    downs: &HashMap<String, Client>,
    n: usize,
    report: Option<Arc<Report>>,
) -> Vec<JoinHandle<()>> {
    let pp = PatchParams::apply(RELAY_MANAGER).force();
    let mut tasks = Vec::new();
    let (hub_fan, pp_fan) = (hub.clone(), pp.clone());
    tasks.push(tokio::spawn(async move {
        let source: Api<Secret> = Api::namespaced(hub_fan.clone(), WORKSPACE);
        let config = watcher::Config::default().fields(&format!("metadata.name={RELAY_SOURCE}"));
        let mut events = watcher(source, config)
            .default_backoff()
            .applied_objects()
            .boxed();
        let mut last = String::new();
        while let Some(item) = events.next().await {
            let Ok(s) = item else { continue };
            let rv = s.metadata.resource_version.clone().unwrap_or_default();
            if rv == last {
                continue;
            }
            last = rv;
            let writes = (0..n).map(|i| {
                let api: Api<Secret> = Api::namespaced(hub_fan.clone(), &format!("relay-{i:05}"));
                let mut copy = secret(0);
                copy.data = s.data.clone();
                let pp = pp_fan.clone();
                async move { api.patch("creds", &pp, &Patch::Apply(&copy)).await }
            });
            let results: Vec<_> = stream::iter(writes)
                .buffer_unordered(IN_FLIGHT)
                .collect()
                .await;
            for r in results {
                if let Err(e) = r {
                    eprintln!("relay fan-out: {e}");
                }
            }
        }
    }));
    for i in 0..n {
        let ns = format!("relay-{i:05}");
        let hub_copy: Api<Secret> = Api::namespaced(hub.clone(), &ns);
        let down: Api<Secret> = Api::namespaced(downs[&downstream_of(i)].clone(), &ns);
        let pp = pp.clone();
        let report = report.clone().map(|r| {
            let api: Api<DynamicObject> = Api::namespaced_with(hub.clone(), &ns, &r.resource);
            (r, api)
        });
        tasks.push(tokio::spawn(async move {
            let config = watcher::Config::default().fields("metadata.name=creds");
            let mut events = watcher(hub_copy, config)
                .default_backoff()
                .applied_objects()
                .boxed();
            while let Some(item) = events.next().await {
                let Ok(s) = item else { continue };
                let version = s.metadata.resource_version.clone().unwrap_or_default();
                let mut copy = secret(0);
                copy.data = s.data;
                if let Err(e) = down.patch("creds", &pp, &Patch::Apply(&copy)).await {
                    eprintln!("relay {ns}: {e}");
                    continue;
                }
                if let Some((report, api)) = &report {
                    let body = report_body(report, &version);
                    if let Err(e) = api.patch_status("creds", &pp, &Patch::Apply(&body)).await {
                        eprintln!("relay {ns} report: {e}");
                    }
                }
            }
        }));
    }
    tasks
}

/// The relay's copies: downstream (`downstream/relay-<i>`) and on the hub (`relay/relay-<i>`).
struct RelayKeys<'a> {
    downstream: &'a [String],
    hub: &'a [String],
}

/// One relay phase's figures.
struct RelayRun {
    rotations: u32,
    secs: f64,
    latency: Value,
    hub_latency: Value,
    missing: usize,
    hub_apiserver_cpu: f64,
    bench_cpu: f64,
}

impl RelayRun {
    /// Prints the phase beside tender's latency `tender` and hub apiserver CPU.
    fn show(&self, what: &str, tender: &Value, tender_cpu: f64) {
        println!(
            "  {} rotations through the {what} in {:.1} s, hub apiserver CPU {:.1} s, {} copies missed",
            self.rotations, self.secs, self.hub_apiserver_cpu, self.missing
        );
        show(what, &self.latency);
        show_hub(what, &self.hub_latency);
        let ratio = |k: &str| {
            let (a, b) = (
                tender[k].as_f64().unwrap_or(0.0),
                self.latency[k].as_f64().unwrap_or(0.0),
            );
            if b > 0.0 { a / b } else { 0.0 }
        };
        println!(
            "  tender / {what}: p50 x{:.2}, p95 x{:.2}, p99 x{:.2}, max x{:.2}; hub apiserver CPU x{:.2}",
            ratio("p50_ms"),
            ratio("p95_ms"),
            ratio("p99_ms"),
            ratio("max_ms"),
            if self.hub_apiserver_cpu > 0.0 {
                tender_cpu / self.hub_apiserver_cpu
            } else {
                0.0
            }
        );
    }

    fn json(&self) -> Value {
        json!({"rotations": self.rotations, "latency": self.latency,
               "hub_copy_latency": self.hub_latency, "missing": self.missing,
               "hub_apiserver_cpu_s": self.hub_apiserver_cpu, "bench_cpu_s": self.bench_cpu})
    }
}

/// `args.rotations` rotations of the relay's source, versions `first`…, each waited for.
async fn relay_rotations(
    args: &Args,
    sources: &Api<Secret>,
    seen: &Seen,
    hub_seen: &Seen,
    keys: &RelayKeys<'_>,
    pids: &Pids,
    first: u32,
) -> Result<RelayRun> {
    let per_rotation = Duration::from_secs(120);
    let (mut lat_all, mut hub_all, mut missing_all) = (Vec::new(), Vec::new(), 0);
    let before = cpu_now(pids);
    let t_all = Instant::now();
    for r in 0..args.rotations {
        let v = first + r;
        let start = Instant::now();
        let patch = Patch::Merge(json!({"data": secret(v).data}));
        sources
            .patch(RELAY_SOURCE, &PatchParams::default(), &patch)
            .await?;
        let (lat, missing) = wait_version(seen, keys.downstream, v, start, per_rotation).await;
        missing_all += missing;
        lat_all.extend(lat);
        let (lat, _) = wait_version(hub_seen, keys.hub, v, start, HUB_LAG).await;
        hub_all.extend(lat);
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let after = cpu_now(pids);
    Ok(RelayRun {
        rotations: args.rotations,
        secs: t_all.elapsed().as_secs_f64(),
        latency: percentiles(lat_all),
        hub_latency: percentiles(hub_all),
        missing: missing_all,
        hub_apiserver_cpu: after[1] - before[1],
        bench_cpu: after[0] - before[0],
    })
}

/// The reporting relay's custom resource: the kind `RelayReport` of tender's BundleDeployment
/// schema under the bench group, one `relay-<i>/creds` holding a BundleDeployment's spec, and
/// the status tender's agents wrote to that BundleDeployment.
async fn reporting_setup(admin: &Client, n: usize) -> Result<Report> {
    const KIND: &str = "RelayReport";
    crate::install_crd(admin, &crate::baseline::variant_crd(KIND)?).await?;
    // A new group takes a moment to reach discovery in every apiserver handler.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let resource = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(crate::baseline::ANATOMY_GROUP, "v1alpha1", KIND),
        &format!("{}s", KIND.to_lowercase()),
    );
    let bds: Api<BundleDeployment> = Api::all(admin.clone());
    let sample = bds
        .list(&kube::api::ListParams::default().limit(1))
        .await?
        .items
        .into_iter()
        .next()
        .context("no BundleDeployment to take the reported status from")?;
    let status = serde_json::to_value(sample.status.context("a BundleDeployment without status")?)?;
    let body = json!({
        "apiVersion": resource.api_version, "kind": KIND,
        "metadata": {"name": "creds"}, "spec": sample.spec,
    });
    let pp = PatchParams::apply(RELAY_MANAGER).force();
    let creates = (0..n).map(|i| {
        let api: Api<DynamicObject> =
            Api::namespaced_with(admin.clone(), &format!("relay-{i:05}"), &resource);
        let (body, pp) = (body.clone(), pp.clone());
        async move {
            api.patch("creds", &pp, &Patch::Apply(&body))
                .await
                .map(|_| ())
        }
    });
    let results: Vec<_> = stream::iter(creates)
        .buffer_unordered(IN_FLIGHT)
        .collect()
        .await;
    results.into_iter().collect::<kube::Result<Vec<()>>>()?;
    Ok(Report { resource, status })
}

/// Targets per Bundle: the CRD allows at most 100.
const TARGETS_PER_BUNDLE: usize = 100;

/// Bundles deploying the two sources to every cluster, each cluster in its own downstream
/// namespace `app-<i>` (one target per cluster, so ⌈N/100⌉ Bundles).
pub(crate) fn agents_bundles(n: usize) -> Vec<Bundle> {
    let entry = |kind: &str, name: &str| DownstreamResource {
        api_version: None,
        kind: kind.into(),
        name: name.into(),
    };
    (0..n)
        .step_by(TARGETS_PER_BUNDLE)
        .map(|first| {
            let spec = BundleSpec {
                targets: (first..n.min(first + TARGETS_PER_BUNDLE))
                    .map(|i| BundleTarget {
                        cluster_name: Some(cluster_name(i)),
                        default_namespace: Some(format!("app-{i:05}")),
                        ..Default::default()
                    })
                    .collect(),
                downstream_resources: vec![
                    entry("Secret", "creds"),
                    entry("ConfigMap", "settings"),
                ],
                ..Default::default()
            };
            Bundle::new(&format!("{BUNDLE}-{}", first / TARGETS_PER_BUNDLE), spec)
        })
        .collect()
}

/// Runs the agents benchmark; returns its figures as JSON.
pub async fn run(n: usize, args: &Args) -> Result<Value> {
    let timeout = Duration::from_secs(args.timeout_seconds);
    let env = TestEnv::start(EnvOptions {
        downstream: 2,
        state_dir: None,
    })
    .await?;
    let pids = Pids::find(&env)?;
    let admin = env.client(HUB).await?;
    install_crds(&admin).await?;
    create_namespaces(&admin, vec![WORKSPACE.into()]).await?;
    let mut downs = HashMap::new();
    for d in [downstream_name(1), downstream_name(2)] {
        downs.insert(d.clone(), env.client(&d).await?);
    }
    let hub = start_hub(&env, hub_config(WORKSPACE)).await?;
    let rss_start = own_rss_mb();
    let mut out = serde_json::Map::new();
    out.insert("agents".into(), json!(n));

    // Registrations, then sources.
    let clusters: Api<Cluster> = Api::namespaced(admin.clone(), WORKSPACE);
    let start = Instant::now();
    let provisioned = wait_all(
        "provisioned Clusters",
        clusters.clone(),
        watcher::Config::default(),
        n,
        start,
        timeout,
        |c: &Cluster| c.status.as_ref().is_some_and(|s| s.namespace.is_some()),
    );
    let register = async {
        let creates = (0..n).map(|i| {
            let c = Cluster::new(&cluster_name(i), ClusterSpec::default());
            let api = clusters.clone();
            async move { api.create(&PostParams::default(), &c).await.map(|_| ()) }
        });
        let results: Vec<_> = stream::iter(creates)
            .buffer_unordered(IN_FLIGHT)
            .collect()
            .await;
        results.into_iter().collect::<kube::Result<Vec<()>>>()?;
        Ok::<(), anyhow::Error>(())
    };
    let (secs, ()) = tokio::try_join!(provisioned, register)?;
    println!("agents N={n}: {n} Clusters provisioned in {secs:.1} s");
    out.insert("provision_s".into(), json!(secs));
    let pp = PostParams::default();
    let sources: Api<Secret> = Api::namespaced(admin.clone(), WORKSPACE);
    sources.create(&pp, &secret(1)).await?;
    Api::<ConfigMap>::namespaced(admin.clone(), WORKSPACE)
        .create(&pp, &config_map())
        .await?;

    // Agents: own identity (token of the cluster's ServiceAccount), own agent namespace.
    let start = Instant::now();
    let kubeconfigs: Vec<_> = stream::iter((0..n).map(|i| {
        let (env, admin) = (&env, &admin);
        async move { agent_kubeconfig(env, admin, WORKSPACE, &cluster_name(i)).await }
    }))
    .buffered(IN_FLIGHT)
    .collect()
    .await;
    let mut agents: Vec<AgentHandle> = Vec::with_capacity(n);
    let signing_keys = tender_e2e::hub_harness::hub_signing_keys(&admin, WORKSPACE).await;
    for (i, kc) in kubeconfigs.into_iter().enumerate() {
        let mut config = tender_agent::AgentConfig::new(WORKSPACE, &cluster_name(i));
        config.hub_signing_keys = signing_keys.clone();
        config.agent_namespace = format!("tender-agent-{i:05}");
        agents.push(start_agent(&env, &kc?, &downstream_of(i), config).await?);
    }
    let deadline = Instant::now() + timeout;
    while agents.iter().any(|a| !a.health.is_ready()) {
        if let Some(a) = agents.iter().find(|a| a.is_finished()) {
            bail!("agent of {} ended during start-up", a.config.cluster_name);
        }
        if Instant::now() > deadline {
            bail!("agents not ready after {timeout:?}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let secs = start.elapsed().as_secs_f64();
    println!(
        "  {n} agents started and ready in {secs:.1} s; bench RSS {:.0} MB",
        own_rss_mb()
    );
    out.insert("agents_ready_s".into(), json!(secs));

    // Observers of every downstream `creds` Secret.
    let seen: Seen = Arc::default();
    let observers: Vec<_> = downs
        .iter()
        .map(|(d, c)| observe(c.clone(), d.clone(), "creds", seen.clone()))
        .collect();
    let app_keys: Vec<String> = (0..n)
        .map(|i| format!("{}/app-{i:05}", downstream_of(i)))
        .collect();
    // And of the copies on the hub (tender's by the Bundle namespace label, the relay's by
    // name): how much of a rotation's latency is the hub's fan-out, how much the agents'.
    let hub_seen: Seen = Arc::default();
    let tender_copies = watcher::Config::default().labels(&format!(
        "{}={WORKSPACE}",
        tender_types::labels::BUNDLE_NAMESPACE
    ));
    let relay_copies = watcher::Config::default().fields("metadata.name=creds");
    let hub_observers = [
        observe_where(
            admin.clone(),
            "tender".into(),
            tender_copies,
            hub_seen.clone(),
        ),
        observe_where(
            admin.clone(),
            "relay".into(),
            relay_copies,
            hub_seen.clone(),
        ),
    ];
    let relay_keys: Vec<String> = (0..n)
        .map(|i| format!("{}/relay-{i:05}", downstream_of(i)))
        .collect();

    // First deployment.
    let lease_gaps = LeaseGaps::watch(admin.clone());
    let start = Instant::now();
    for bundle in agents_bundles(n) {
        Api::<Bundle>::namespaced(admin.clone(), WORKSPACE)
            .create(&pp, &bundle)
            .await?;
    }
    let (_, missing) = wait_version(&seen, &app_keys, 1, start, timeout).await;
    if missing > 0 {
        bail!("first deployment: {missing} of {n} downstream copies missing after {timeout:?}");
    }
    let secs = start.elapsed().as_secs_f64();
    println!("  first deployment: every downstream copy present after {secs:.1} s");
    out.insert("first_deploy_s".into(), json!(secs));
    // Converged only when every agent has reported its whole deployment applied and ready:
    // a copy can be downstream while the rest of its deployment is still on its way (one
    // agent's write stuck for a minute and a half in a run).
    let in_bench = watcher::Config::default()
        .labels(&format!("{}={WORKSPACE}", tender_types::labels::WORKSPACE));
    let secs = wait_all(
        "BundleDeployments applied and ready",
        Api::<BundleDeployment>::all(admin.clone()),
        in_bench,
        n,
        start,
        timeout,
        |bd: &BundleDeployment| {
            bd.status.as_ref().is_some_and(|s| {
                s.applied_deployment_id.as_deref() == Some(bd.spec.deployment_id.as_str())
                    && tender_types::conditions::is_true(
                        &s.conditions,
                        tender_types::conditions::TYPE_READY,
                    )
            })
        },
    )
    .await?;
    println!("  first deployment: every BundleDeployment applied and ready after {secs:.1} s");
    out.insert("first_deploy_ready_s".into(), json!(secs));
    let hub_requests = || requests(std::iter::once(hub.metrics.encode()));
    let agent_requests = || requests(agents.iter().map(|a| a.metrics.shared().encode()));
    let writes_so_far = || {
        let total = |m: BTreeMap<String, u64>| m.values().sum::<u64>();
        total(non_heartbeat_writes(&hub_requests(), false))
            + total(non_heartbeat_writes(&agent_requests(), true))
    };
    // Settled: no write but heartbeats, and no Bundle reconcile (so the hub's caches have
    // caught up with the agents' writes, whose events wake their Bundles), for 3 s plus the
    // hub's Cluster summary delay.
    let activity = || writes_so_far() + hub.reconciles("bundle");
    // ... and no write but heartbeats still in flight (one sent before the window and
    // answered in it is followed by its Events, written in the window).
    let writes_in_flight = || {
        let hub = non_heartbeat_writes(&in_flight(std::iter::once(hub.metrics.encode())), false);
        let agents = non_heartbeat_writes(
            &in_flight(agents.iter().map(|a| a.metrics.shared().encode())),
            true,
        );
        hub.values().chain(agents.values()).sum::<u64>()
    };
    let quiet = Duration::from_secs(3) + tender_hub::DEFAULT_CLUSTER_SUMMARY_DELAY;
    let (mut last, mut since) = (activity(), Instant::now());
    let settle_start = Instant::now();
    while since.elapsed() < quiet && settle_start.elapsed() < timeout {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let now = activity();
        if now != last || writes_in_flight() > 0 {
            (last, since) = (now, Instant::now());
        }
    }

    // Idle with N agents watching (heartbeats every 30 s included): no other write. A watch
    // of the Clusters names what moved in any hub-owned status written meanwhile.
    let moves = StatusMoves::watch(clusters.clone());
    moves.until_ready().await;
    let (hub_before, agents_before) = (hub_requests(), agent_requests());
    let before = cpu_now(&pids);
    tokio::time::sleep(Duration::from_secs(args.idle_seconds)).await;
    let after = cpu_now(&pids);
    let hub_idle = non_heartbeat_writes(&delta(&hub_before, &hub_requests()), false);
    let agents_idle = non_heartbeat_writes(&delta(&agents_before, &agent_requests()), true);
    let idle_writes: u64 = hub_idle.values().chain(agents_idle.values()).sum();
    let idle_ok = idle_writes == 0;
    println!(
        "  idle {} s: {idle_writes} writes but heartbeats (hub {hub_idle:?}, agents {agents_idle:?}), expected 0 {}",
        args.idle_seconds,
        if idle_ok { "OK" } else { "FAILED" }
    );
    let moved = moves.finish();
    let hb = lease_gaps.finish();
    println!(
        "  heartbeats from the first deployment to the idle window's end: {} Lease renewals seen; longest gap between renewals {:.1} s ({}), longest lag from renewTime to the hub's watch {:.1} s ({})",
        hb.renewals, hb.longest_gap_s, hb.gap_namespace, hb.longest_lag_s, hb.lag_namespace
    );
    for m in moved.iter().take(20) {
        println!("    moved while idle: {m}");
    }
    if moved.len() > 20 {
        println!("    … and {} more", moved.len() - 20);
    }
    let mut failed = Vec::new();
    if !idle_ok {
        failed.push(format!(
            "{n} agents: {idle_writes} writes while idle (hub {hub_idle:?}, agents {agents_idle:?})"
        ));
    }
    let idle_cpu: Vec<f64> = (0..4).map(|i| after[i] - before[i]).collect();
    let apiserver_rss = mem_mb(Some(pids.apiserver), "VmRSS");
    println!(
        "  idle {} s with {n} agents: CPU s bench {:.1} hub apiserver {:.1} etcd {:.1} ({:.1}% of a core for the hub apiserver); hub apiserver RSS {apiserver_rss:.0} MB; bench RSS {:.0} MB (+{:.0} since the hub started)",
        args.idle_seconds,
        idle_cpu[0],
        idle_cpu[1],
        idle_cpu[2],
        idle_cpu[1] * 100.0 / args.idle_seconds as f64,
        own_rss_mb(),
        own_rss_mb() - rss_start,
    );
    out.insert(
        "idle".into(),
        json!({"seconds": args.idle_seconds, "cpu_s": {"bench": idle_cpu[0],
        "hub_apiserver": idle_cpu[1], "etcd": idle_cpu[2], "hub_kcm": idle_cpu[3]},
        "writes_but_heartbeats": {"hub": hub_idle, "agents": agents_idle},
        "cluster_status_moves": moved,
        "heartbeats": {"renewals": hb.renewals, "longest_gap_s": hb.longest_gap_s,
            "longest_lag_s": hb.longest_lag_s},
        "hub_apiserver_rss_mb": apiserver_rss, "bench_rss_mb": own_rss_mb()}),
    );

    // Rotations through tender.
    let per_rotation = Duration::from_secs(120);
    let mut tender_lat = Vec::new();
    let mut tender_hub_lat = Vec::new();
    let mut tender_missing = 0;
    let tender_hub_keys: Vec<String> = {
        let seen = hub_seen.lock().expect("seen lock");
        seen.keys()
            .filter(|k| k.starts_with("tender/"))
            .cloned()
            .collect()
    };
    if tender_hub_keys.len() != n {
        bail!(
            "{} copies of creds seen on the hub for {n} clusters",
            tender_hub_keys.len()
        );
    }
    // What each BundleDeployment status write of the rotations moved, to name the writes
    // beyond one per cluster and rotation.
    let bd_moves = StatusMoves::watch_bundle_deployments(Api::all(admin.clone()));
    bd_moves.until_ready().await;
    let (hub_before, agents_before) = (hub_requests(), agent_requests());
    let before = cpu_now(&pids);
    let t_all = Instant::now();
    for r in 0..args.rotations {
        let v = 2 + r;
        let start = Instant::now();
        let patch = Patch::Merge(json!({"data": secret(v).data}));
        sources
            .patch("creds", &PatchParams::default(), &patch)
            .await?;
        let (lat, missing) = wait_version(&seen, &app_keys, v, start, per_rotation).await;
        tender_missing += missing;
        tender_lat.extend(lat);
        let (lat, _) = wait_version(&hub_seen, &tender_hub_keys, v, start, HUB_LAG).await;
        tender_hub_lat.extend(lat);
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let after = cpu_now(&pids);
    let tender_cpu = after[1] - before[1];
    let hub_delta = delta(&hub_before, &hub_requests());
    let agents_delta = delta(&agents_before, &agent_requests());
    let fmt = |m: &BTreeMap<String, u64>| {
        m.iter()
            .map(|(k, n)| format!("{k} {n}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    println!("  requests over the rotations, hub: {}", fmt(&hub_delta));
    println!(
        "  requests over the rotations, all agents (hub and downstream): {}",
        fmt(&agents_delta)
    );
    // The last status writes of the last rotation may land after its copies were seen.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let bd_shapes = status_moves::shapes(&bd_moves.finish());
    let bd_total: usize = bd_shapes.iter().map(|(k, _, _)| k).sum();
    println!(
        "  BundleDeployment status changes over the rotations: {bd_total} ({:.2} per cluster and rotation), by the fields they moved:",
        bd_total as f64 / (n as f64 * f64::from(args.rotations.max(1)))
    );
    for (k, shape, example) in bd_shapes.iter().take(6) {
        let example: String = example.chars().take(600).collect();
        println!("    {k:>6} × {shape}\n           e.g. {example}");
    }
    let p = percentiles(tender_lat);
    println!(
        "  {} rotations through tender in {:.1} s, hub apiserver CPU {tender_cpu:.1} s, {tender_missing} copies missed",
        args.rotations,
        t_all.elapsed().as_secs_f64()
    );
    show("tender", &p);
    let hub_p = percentiles(tender_hub_lat);
    show_hub("tender", &hub_p);
    out.insert(
        "tender".into(),
        json!({"rotations": args.rotations, "latency": p, "hub_copy_latency": hub_p,
               "missing": tender_missing,
               "hub_apiserver_cpu_s": tender_cpu, "bench_cpu_s": after[0] - before[0],
               "hub_requests": hub_delta, "agent_requests": agents_delta,
               "bundle_deployment_status_changes": bd_shapes.iter().take(10)
                   .map(|(k, shape, _)| json!({"count": k, "fields": shape}))
                   .collect::<Vec<_>>()}),
    );

    // The relay, same run, same clusters.
    let mut relay_ns: HashMap<String, Vec<String>> = HashMap::new();
    for i in 0..n {
        relay_ns
            .entry(downstream_of(i))
            .or_default()
            .push(format!("relay-{i:05}"));
    }
    create_namespaces(&admin, (0..n).map(|i| format!("relay-{i:05}")).collect()).await?;
    for (d, names) in relay_ns {
        create_namespaces(&downs[&d], names).await?;
    }
    let relay = start_relay(admin.clone(), &downs, n, None);
    let mut src = secret(1);
    src.metadata.name = Some(RELAY_SOURCE.into());
    sources.create(&pp, &src).await?;
    let (_, missing) = wait_version(&seen, &relay_keys, 1, Instant::now(), timeout).await;
    if missing > 0 {
        bail!("relay: {missing} of {n} downstream copies missing after {timeout:?}");
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    let relay_hub_keys: Vec<String> = (0..n).map(|i| format!("relay/relay-{i:05}")).collect();
    let keys = RelayKeys {
        downstream: &relay_keys,
        hub: &relay_hub_keys,
    };
    let plain = relay_rotations(args, &sources, &seen, &hub_seen, &keys, &pids, 2).await?;
    plain.show("relay", &p, tender_cpu);
    out.insert("relay".into(), plain.json());
    for t in relay {
        t.abort();
    }

    // The relay again, now also writing one status per cluster and rotation into a custom
    // resource of tender's BundleDeployment schema, holding what tender's agents report.
    let report = Arc::new(reporting_setup(&admin, n).await?);
    let relay = start_relay(admin.clone(), &downs, n, Some(report.clone()));
    // Each relay task reports the copy it finds at start: wait for the n first reports.
    let reports: Api<DynamicObject> = Api::all_with(admin.clone(), &report.resource);
    let deadline = Instant::now() + timeout;
    loop {
        let listed = reports.list(&kube::api::ListParams::default()).await?;
        let reported = listed
            .items
            .iter()
            .filter(|o| o.data.get("status").is_some())
            .count();
        if reported == n {
            break;
        }
        if Instant::now() > deadline {
            bail!("reporting relay: {reported} of {n} first reports after {timeout:?}");
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    let first = 2 + args.rotations;
    let reporting = relay_rotations(args, &sources, &seen, &hub_seen, &keys, &pids, first).await?;
    reporting.show("reporting relay", &p, tender_cpu);
    out.insert("reporting_relay".into(), reporting.json());
    let relay_missing = plain.missing + reporting.missing;

    for t in relay.into_iter().chain(observers).chain(hub_observers) {
        t.abort();
    }
    for a in agents {
        a.kill().await;
    }
    hub.stop().await.context("stopping the hub")?;
    drop(env);
    if tender_missing > 0 || relay_missing > 0 {
        bail!("{tender_missing} tender and {relay_missing} relay copies never arrived");
    }
    out.insert("failed".into(), json!(failed));
    Ok(Value::Object(out))
}
