//! `tender-bench`: how the hub scales with the number of clusters, on a real hub apiserver.
//!
//! For each size N (smallest first, so it is the in-run baseline) it starts a fresh hub-only
//! environment, runs the hub in-process (the same library code as `tender-hub`) and measures:
//!
//! - provision: N Clusters registered (no agents) until every one has its namespace and agent
//!   identity (the hub writes `status.namespace` after provisioning all of it);
//! - fan-out: one Bundle selecting every cluster, copying a Secret and a ConfigMap and carrying
//!   two small manifests, until N BundleDeployments and 2N copies carry the right hashes;
//! - rotation: the Secret changes until every copy carries the new hash;
//! - idle: a quiet window in which the hub must not write.
//!
//! Completion is observed with watches (no polling load on the apiserver). Per phase it reports
//! the hub's requests (from its own counter, Lease renewals excluded), CPU seconds of the bench
//! process (the hub, plus the bench's watches), the apiserver, etcd and the controller-manager,
//! and resident memory. Run it on purpose (see docs/benchmarks.md):
//!
//! ```sh
//! cargo run --release -p tender-e2e --bin tender-bench -- --clusters 100,1000
//! ```
//!
//! It checks two invariants at every size and exits non-zero (after printing every figure)
//! when one fails: the rotation writes exactly N times (N Secret copies, no BundleDeployment:
//! decision 0089-signed-copies) and the hub writes nothing while idle.
//!
//! Beside the fan-out and the rotation it measures their baseline in the same run on the same
//! apiserver (`bench/baseline.rs`: a minimal client writing as many objects of the same sizes
//! with the same concurrency) and prints each phase's ratio to it. `--agents N` runs N
//! in-process agents over two downstream clusters instead and measures rotation latency beside
//! a minimal relay (`bench/agents.rs`). `--json PATH` writes every figure as JSON.

use std::collections::{BTreeMap, HashSet};
use std::fmt::Debug;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Parser;
use futures::{StreamExt, stream};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::api::{Api, ListParams, ObjectMeta, PartialObjectMeta, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Resource, ResourceExt};
use serde::de::DeserializeOwned;
use tender_e2e::crds::{apply_crd as install_crd, install_crds};
use tender_e2e::hub_harness::{
    HubHandle, RequestSeries, WRITE_VERBS, hub_config, request_series, start_hub,
};
use tender_e2e::{EnvOptions, EnvRecord, HUB, TestEnv};
use tender_types::{
    Bundle, BundleDeployment, BundleSpec, BundleTarget, Cluster, ClusterSpec, DownstreamResource,
    Manifest, hash, labels,
};

#[path = "../bench/agents.rs"]
mod agents;
#[path = "../bench/baseline.rs"]
mod baseline;
#[path = "../bench/peers/mod.rs"]
mod peers;
#[path = "../bench/status_moves.rs"]
mod status_moves;
#[path = "../bench/waves.rs"]
mod waves;

use baseline::Baseline;

// `--features jemalloc|mimalloc` measures the hub under another global allocator (the shipped
// binaries use the system one; docs/benchmarks.md "Allocator").
#[cfg(feature = "jemalloc")]
#[global_allocator]
static ALLOC: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;
#[cfg(all(feature = "mimalloc", not(feature = "jemalloc")))]
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;
const ALLOCATOR: &str = if cfg!(feature = "jemalloc") {
    "jemalloc"
} else if cfg!(feature = "mimalloc") {
    "mimalloc"
} else {
    "system"
};

const WORKSPACE: &str = "bench";
const BUNDLE: &str = "app";

#[derive(Parser)]
#[command(about = "Scale benchmark of tender-hub against a real hub apiserver (no agents)")]
struct Args {
    /// Cluster counts to measure, comma-separated; the smallest is the baseline.
    #[arg(long, value_delimiter = ',', default_value = "100,1000")]
    clusters: Vec<usize>,
    /// Length of the idle window, in seconds.
    #[arg(long, default_value_t = 20)]
    idle_seconds: u64,
    /// Give up on a phase after this many seconds.
    #[arg(long, default_value_t = 900)]
    timeout_seconds: u64,
    /// Bundles per run, each selecting every cluster and copying the same two sources
    /// (more than 1 skips the baseline).
    #[arg(long, default_value_t = 1)]
    bundles: usize,
    /// Skip the in-run baseline (a minimal client's writes of the same objects).
    #[arg(long)]
    no_baseline: bool,
    /// Instead of the hub sizes: N Clusters with N in-process agents over two downstream
    /// clusters, rotation latency beside a minimal relay.
    #[arg(long)]
    agents: Option<usize>,
    /// Instead of the hub sizes: a rotation through 4 rollout waves over N Clusters, the bench
    /// playing the agents (docs/rollouts.md).
    #[arg(long)]
    waves: Option<usize>,
    /// Soak seconds per wave in `--waves` mode.
    #[arg(long, default_value_t = 2)]
    soak_seconds: u32,
    /// Rotations measured in `--agents` mode.
    #[arg(long, default_value_t = 20)]
    rotations: u32,
    /// Hub sizes, after the idle window: this many more rotations, each followed by its
    /// baseline, so the rotation ratio is a median over pairs (0: the first rotation only).
    #[arg(long, default_value_t = 5)]
    rotation_pairs: u32,
    /// Instead of the hub sizes: tender beside these peers on their own workloads
    /// (comma-separated: flux, kyverno), built from their Go modules on first use.
    #[arg(long, value_delimiter = ',')]
    peers: Vec<String>,
    /// Targets (namespaces) in `--peers` mode.
    #[arg(long, default_value_t = 50)]
    targets: usize,
    /// Hub replicas: every size runs with one replica, then with this many (the unsharded one
    /// plus shards `s1`..), Clusters spread evenly over them by label (1: one run).
    #[arg(long, default_value_t = 1)]
    shards: usize,
    /// Also write the figures as JSON to this file (e.g. docs/benchmarks/<date>-n1000.json).
    #[arg(long)]
    json: Option<std::path::PathBuf>,
}

// ---------------------------------------------------------------- processes (/proc)

fn proc_file(pid: Option<u32>, file: &str) -> String {
    let who = pid.map_or("self".to_string(), |p| p.to_string());
    std::fs::read_to_string(format!("/proc/{who}/{file}")).unwrap_or_default()
}

/// A `kB` field of `/proc/<pid>/status` (`VmRSS`, `VmHWM`), in MB.
fn mem_mb(pid: Option<u32>, field: &str) -> f64 {
    proc_file(pid, "status")
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0)
}

/// The bench process's RSS after handing freed heap pages back, so it is close to live memory.
#[allow(unsafe_code)] // libc calls, each with a SAFETY comment
fn own_rss_mb() -> f64 {
    // SAFETY: glibc's malloc_trim only returns free heap pages to the kernel.
    unsafe { libc::malloc_trim(0) };
    mem_mb(None, "VmRSS")
}

/// User + system CPU seconds of a process so far.
#[allow(unsafe_code)] // libc calls, each with a SAFETY comment
fn cpu_secs(pid: Option<u32>) -> f64 {
    let stat = proc_file(pid, "stat");
    let Some((_, rest)) = stat.rsplit_once(") ") else {
        return 0.0;
    };
    let f: Vec<u64> = rest
        .split_whitespace()
        .map(|v| v.parse().unwrap_or(0))
        .collect();
    // SAFETY: sysconf has no preconditions.
    let tick = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    // utime and stime are fields 14 and 15; `rest` starts at field 3.
    (f.get(11).unwrap_or(&0) + f.get(12).unwrap_or(&0)) as f64 / tick
}

/// The environment's processes, found from `env.json` by their sub-command.
struct Pids {
    apiserver: u32,
    etcd: u32,
    kcm: u32,
}

impl Pids {
    fn find(env: &TestEnv) -> Result<Pids> {
        let record: EnvRecord =
            serde_json::from_slice(&std::fs::read(env.state_dir().join("env.json"))?)?;
        // The hub's apiserver and controller-manager (an environment may have downstreams).
        let by_cmd = |what: &str, marker: &str| {
            record
                .pids
                .iter()
                .copied()
                .find(|p| {
                    let cmdline = proc_file(Some(*p), "cmdline");
                    cmdline.split('\0').nth(1) == Some(what) && cmdline.contains(marker)
                })
                .with_context(|| format!("no {what} process of the hub in env.json"))
        };
        Ok(Pids {
            apiserver: by_cmd("kube-apiserver", &format!("--etcd-prefix=/{HUB}"))?,
            etcd: by_cmd("etcd", "")?,
            kcm: by_cmd("kube-controller-manager", &format!("/{HUB}.kubeconfig"))?,
        })
    }
}

/// CPU seconds so far: bench, apiserver, etcd, controller-manager.
fn cpu_now(pids: &Pids) -> [f64; 4] {
    [
        cpu_secs(None),
        cpu_secs(Some(pids.apiserver)),
        cpu_secs(Some(pids.etcd)),
        cpu_secs(Some(pids.kcm)),
    ]
}

// ---------------------------------------------------------------- phases

/// Counters at one moment.
struct Snap {
    requests: Vec<RequestSeries>,
    /// Cluster reconciles, Bundle reconciles, failed reconciles.
    reconciles: [u64; 3],
    /// CPU seconds: bench, apiserver, etcd, controller-manager.
    cpu: [f64; 4],
}

/// The counters of every replica, summed.
fn snap(hubs: &[HubHandle], pids: &Pids) -> Snap {
    let mut requests: BTreeMap<(String, String, String), u64> = BTreeMap::new();
    let mut reconciles = [0; 3];
    for hub in hubs {
        let text = hub.metrics.encode();
        let errors: u64 = text
            .lines()
            .filter(|l| l.starts_with("reconcile_errors_total{"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
            .sum();
        for (verb, res, sub, n) in request_series(&text) {
            *requests.entry((verb, res, sub)).or_default() += n;
        }
        reconciles[0] += hub.reconciles("cluster");
        reconciles[1] += hub.reconciles("bundle");
        reconciles[2] += errors;
    }
    Snap {
        requests: requests
            .into_iter()
            .map(|((verb, res, sub), n)| (verb, res, sub, n))
            .collect(),
        reconciles,
        cpu: cpu_now(pids),
    }
}

/// Write requests of every replica.
fn writes(hubs: &[HubHandle]) -> u64 {
    hubs.iter().map(HubHandle::writes).sum()
}

/// The shard of replica `i` of `k` (`None`: the unsharded replica, index 0).
fn shard_id(i: usize) -> Option<String> {
    (i > 0).then(|| format!("s{i}"))
}

/// What one replica caches of the per-cluster objects (its selectors' objects, counted on
/// the apiserver), after the fan-out: the part of memory sharding divides.
struct ReplicaCache {
    shard: Option<String>,
    clusters: usize,
    bundle_deployments: usize,
    copies: usize,
    namespaces: usize,
    /// JSON bytes of those objects as cached (BundleDeployments whole, the rest metadata;
    /// managedFields dropped).
    bytes: usize,
}

/// Lists `lp` 500 at a time and sums `bytes` over the items: (items, bytes).
async fn each_page<T, F, Fut>(
    lp: &ListParams,
    mut list: F,
    bytes: impl Fn(&T) -> usize,
) -> Result<(usize, usize)>
where
    T: Clone + DeserializeOwned,
    F: FnMut(ListParams) -> Fut,
    Fut: std::future::Future<Output = kube::Result<kube::api::ObjectList<T>>>,
{
    let mut page = lp.clone().limit(500);
    let (mut items, mut total) = (0, 0);
    loop {
        let list = list(page.clone()).await?;
        items += list.items.len();
        total += list.items.iter().map(&bytes).sum::<usize>();
        match list.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => page = page.continue_token(&token),
            None => return Ok((items, total)),
        }
    }
}

/// [`each_page`] over the metadata of every `K` matching `lp`: (items, JSON bytes of their
/// metadata without `managedFields`).
async fn metadata_pages<K>(admin: &kube::Client, lp: &ListParams) -> Result<(usize, usize)>
where
    K: kube::Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug,
{
    let api = Api::<K>::all(admin.clone());
    each_page(
        lp,
        |lp| {
            let api = api.clone();
            async move { api.list_metadata(&lp).await }
        },
        |o: &PartialObjectMeta<K>| {
            let mut meta = o.metadata.clone();
            meta.managed_fields = None;
            serde_json::to_vec(&meta).map_or(0, |b| b.len())
        },
    )
    .await
}

async fn replica_caches(admin: &kube::Client, k: usize, n: usize) -> Result<Vec<ReplicaCache>> {
    let mut out = Vec::new();
    for i in 0..k {
        let shard = shard_id(i);
        let own = match &shard {
            Some(id) => format!("{}={WORKSPACE},{}={id}", labels::WORKSPACE, labels::SHARD),
            None => format!("{}={WORKSPACE},!{}", labels::WORKSPACE, labels::SHARD),
        };
        let lp = ListParams::default().labels(&own);
        let copies = ListParams::default().labels(&format!("{own},{}", labels::BUNDLE_NAME));
        let size = |v: serde_json::Value| serde_json::to_vec(&v).map_or(0, |b| b.len());
        let strip = |mut m: ObjectMeta| {
            m.managed_fields = None;
            m
        };
        // Page by page, so the bench's own peak memory (VmHWM, reported as the hub's) does not
        // hold 10 000 BundleDeployments and 20 000 copies at once.
        let bds = Api::<BundleDeployment>::all(admin.clone());
        let (n_bds, bd_bytes) = each_page(
            &lp,
            |lp| {
                let api = bds.clone();
                async move { api.list(&lp).await }
            },
            |bd: &BundleDeployment| {
                let mut bd = bd.clone();
                bd.metadata = strip(bd.metadata);
                serde_json::to_value(&bd).map_or(0, size)
            },
        )
        .await?;
        let (n_secrets, secret_bytes) = metadata_pages::<Secret>(admin, &copies).await?;
        let (n_cms, cm_bytes) = metadata_pages::<ConfigMap>(admin, &copies).await?;
        let (n_nss, ns_bytes) = metadata_pages::<Namespace>(admin, &lp).await?;
        let bytes = bd_bytes + secret_bytes + cm_bytes + ns_bytes;
        out.push(ReplicaCache {
            shard,
            clusters: (0..n).filter(|c| c % k == i).count(),
            bundle_deployments: n_bds,
            copies: n_secrets + n_cms,
            namespaces: n_nss,
            bytes,
        });
    }
    Ok(out)
}

/// What one phase cost.
struct Phase {
    name: &'static str,
    secs: f64,
    /// Hub requests by (verb, resource[/subresource]), Leases excluded, non-zero only.
    requests: BTreeMap<(String, String), u64>,
    reconciles: [u64; 3],
    cpu: [f64; 4],
    rss: f64,
    apiserver_rss: f64,
}

impl Phase {
    fn new(name: &'static str, secs: f64, before: &Snap, after: &Snap, pids: &Pids) -> Phase {
        let mut requests = BTreeMap::new();
        for (verb, res, sub, n) in &after.requests {
            let old = before
                .requests
                .iter()
                .find(|(v, r, s, _)| (v, r, s) == (verb, res, sub))
                .map_or(0, |s| s.3);
            let res = if sub.is_empty() {
                res.clone()
            } else {
                format!("{res}/{sub}")
            };
            if *n > old && res != "leases" {
                *requests.entry((verb.clone(), res)).or_default() += n - old;
            }
        }
        Phase {
            name,
            secs,
            requests,
            reconciles: [0, 1, 2].map(|i| after.reconciles[i] - before.reconciles[i]),
            cpu: [0, 1, 2, 3].map(|i| after.cpu[i] - before.cpu[i]),
            rss: own_rss_mb(),
            apiserver_rss: mem_mb(Some(pids.apiserver), "VmRSS"),
        }
    }

    fn count(&self, f: impl Fn(&str, &str) -> bool) -> u64 {
        self.requests
            .iter()
            .filter(|((v, r), _)| f(v, r))
            .map(|(_, n)| n)
            .sum()
    }

    fn writes(&self) -> u64 {
        self.count(|verb, _| WRITE_VERBS.contains(&verb))
    }

    fn print(&self, n: usize) {
        let list = |verbs: &[&str]| {
            self.requests
                .iter()
                .filter(|((v, _), _)| verbs.contains(&v.as_str()))
                .map(|((v, r), c)| format!("{v} {r} {c}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        println!(
            "  {:<9} {:>6.1} s ({:>5.1} ms/cluster) | reconciles: cluster {} bundle {} failed {} | CPU s: bench {:.1} apiserver {:.1} etcd {:.1} kcm {:.1} | RSS MB: bench {:.0} apiserver {:.0}",
            self.name,
            self.secs,
            self.secs * 1000.0 / n as f64,
            self.reconciles[0],
            self.reconciles[1],
            self.reconciles[2],
            self.cpu[0],
            self.cpu[1],
            self.cpu[2],
            self.cpu[3],
            self.rss,
            self.apiserver_rss,
        );
        println!(
            "            writes {}: {}",
            self.writes(),
            list(&WRITE_VERBS)
        );
        let reads = self.count(|v, _| v == "get" || v == "list");
        println!("            reads  {reads}: {}", list(&["get", "list"]));
    }
}

/// Waits until the hub's write count has not moved for 3 s longer than the hub delays a
/// Cluster summary (at most 120 s), so a phase's figures include its trailing status writes.
async fn settle(hubs: &[HubHandle]) {
    let deadline = Instant::now() + Duration::from_secs(120);
    let quiet = Duration::from_secs(3) + tender_hub::DEFAULT_CLUSTER_SUMMARY_DELAY;
    let (mut last, mut since) = (writes(hubs), Instant::now());
    while since.elapsed() < quiet && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let now = writes(hubs);
        if now != last {
            (last, since) = (now, Instant::now());
        }
    }
}

/// Watches `api` until `n` objects satisfy `ok`; returns the seconds since `start`.
async fn wait_all<K>(
    what: &str,
    api: Api<K>,
    config: watcher::Config,
    n: usize,
    start: Instant,
    timeout: Duration,
    ok: impl Fn(&K) -> bool,
) -> Result<f64>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
    K::DynamicType: Default,
{
    let key = |o: &K| format!("{}/{}", o.namespace().unwrap_or_default(), o.name_any());
    let mut good = HashSet::new();
    let mut events = watcher(api, config).default_backoff().boxed();
    let deadline = tokio::time::Instant::from_std(start + timeout);
    while good.len() < n {
        let event = match tokio::time::timeout_at(deadline, events.next()).await {
            Err(_) => bail!("{what}: {}/{n} after {timeout:?}", good.len()),
            Ok(None) => bail!("{what}: the watch ended"),
            Ok(Some(Err(error))) => {
                eprintln!("{what}: watch error (retrying): {error}");
                continue;
            }
            Ok(Some(Ok(event))) => event,
        };
        match event {
            watcher::Event::Init => good.clear(),
            watcher::Event::Apply(o) | watcher::Event::InitApply(o) if ok(&o) => {
                good.insert(key(&o));
            }
            watcher::Event::Apply(o) | watcher::Event::InitApply(o) | watcher::Event::Delete(o) => {
                good.remove(&key(&o));
            }
            watcher::Event::InitDone => {}
        }
    }
    Ok(start.elapsed().as_secs_f64())
}

// ---------------------------------------------------------------- the workload

/// `bytes` of text that differ per `version`.
fn payload(version: u32, bytes: usize) -> String {
    let seed = format!("rotation {version} ");
    seed.repeat(bytes / seed.len() + 1)[..bytes].to_string()
}

fn secret(version: u32) -> Secret {
    let data = [("tls.key", 3000), ("password", 64)].map(|(k, len)| {
        (
            k.to_string(),
            ByteString(payload(version, len).into_bytes()),
        )
    });
    Secret {
        metadata: ObjectMeta {
            name: Some("creds".into()),
            ..Default::default()
        },
        data: Some(data.into_iter().collect()),
        ..Default::default()
    }
}

fn config_map() -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some("settings".into()),
            ..Default::default()
        },
        data: Some(BTreeMap::from([("app.yaml".into(), payload(1, 3000))])),
        ..Default::default()
    }
}

/// Name of the `i`-th Bundle: `app`, `app-1`, `app-2`, …
fn bundle_name(i: usize) -> String {
    if i == 0 {
        BUNDLE.to_string()
    } else {
        format!("{BUNDLE}-{i}")
    }
}

fn bundle(name: &str) -> Bundle {
    let entry = |kind: &str, name: &str| DownstreamResource {
        api_version: None,
        kind: kind.into(),
        name: name.into(),
    };
    Bundle::new(
        name,
        BundleSpec {
            targets: vec![BundleTarget {
                cluster_selector: Some(LabelSelector::default()),
                ..Default::default()
            }],
            downstream_resources: vec![entry("Secret", "creds"), entry("ConfigMap", "settings")],
            resources: vec![
                Manifest(
                    serde_json::json!({"apiVersion": "v1", "kind": "ServiceAccount",
                    "metadata": {"name": "app"}}),
                ),
                Manifest(serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": {"name": "app-settings"}, "data": {"mode": "fast"}})),
            ],
            ..Default::default()
        },
    )
}

/// Whether `bd` lists the copy of source `name` (its hash is on the signed copy).
fn lists_copy(bd: &BundleDeployment, name: &str) -> bool {
    let copies = &bd.spec.options.downstream_resources;
    copies.iter().any(|c| c.name == name)
}

fn has_hash<K>(m: &PartialObjectMeta<K>, want: &str) -> bool {
    let annotations = m.metadata.annotations.as_ref();
    annotations
        .and_then(|a| a.get(labels::CONTENT_HASH))
        .map(String::as_str)
        == Some(want)
}

/// One size: a fresh environment and hub, then the four phases. Returns them, the bench's
/// RSS before the hub started and the invariants that failed (empty when all hold).
async fn run_size(n: usize, k: usize, args: &Args) -> Result<Size> {
    let timeout = Duration::from_secs(args.timeout_seconds);
    let env = TestEnv::start(EnvOptions::default()).await?;
    let pids = Pids::find(&env)?;
    let admin = env.client(HUB).await?;
    install_crds(&admin).await?;
    let pp = PostParams::default();
    let ns = Namespace {
        metadata: ObjectMeta {
            name: Some(WORKSPACE.into()),
            ..Default::default()
        },
        ..Default::default()
    };
    Api::<Namespace>::all(admin.clone())
        .create(&pp, &ns)
        .await?;
    let bundles = args.bundles.max(1);
    let with_baseline = !args.no_baseline && bundles == 1 && k == 1;
    if with_baseline {
        // The baseline's stand-in cluster namespaces, made (and filled by the
        // controller-manager: ServiceAccount, root CA ConfigMap) before anything is measured.
        baseline::namespaces(&admin, n).await?;
        let stand_in = |o: &PartialObjectMeta<ConfigMap>| {
            o.metadata
                .namespace
                .as_deref()
                .is_some_and(|ns| ns.starts_with("baseline-"))
        };
        wait_all(
            "baseline namespaces filled",
            Api::<PartialObjectMeta<ConfigMap>>::all(admin.clone()),
            watcher::Config::default().fields("metadata.name=kube-root-ca.crt"),
            n,
            Instant::now(),
            timeout,
            stand_in,
        )
        .await?;
    }
    let rss_before = own_rss_mb();
    let mut hubs = Vec::new();
    for i in 0..k {
        let mut config = hub_config(WORKSPACE);
        config.shard_id = shard_id(i);
        if let Some(leader) = config.leader_election.as_mut() {
            leader.lease_name = labels::hub_lease_name(config.shard_id.as_deref());
        }
        hubs.push(start_hub(&env, config).await?);
    }
    let hub = hubs.as_slice();
    println!(
        "N={n} x {bundles} Bundle(s), {k} hub replica(s): environment up; bench RSS {rss_before:.0} MB before the hub, {:.0} MB with an idle hub; apiserver {:.0} MB",
        own_rss_mb(),
        mem_mb(Some(pids.apiserver), "VmRSS")
    );
    let in_ws = |extra: &str| {
        watcher::Config::default().labels(&format!("{}={WORKSPACE}{extra}", labels::WORKSPACE))
    };
    let mut phases = Vec::new();

    // Provision: register N Clusters (16 creates in flight) while the hub provisions them.
    let clusters: Api<Cluster> = Api::namespaced(admin.clone(), WORKSPACE);
    let before = snap(hub, &pids);
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
            let mut c = Cluster::new(&format!("c-{i:05}"), ClusterSpec::default());
            let mut l = BTreeMap::from([("env".to_string(), "prod".to_string())]);
            if let Some(id) = shard_id(i % k) {
                l.insert(labels::SHARD.to_string(), id);
            }
            c.metadata.labels = Some(l);
            let api = clusters.clone();
            async move { api.create(&PostParams::default(), &c).await.map(|_| ()) }
        });
        let results: Vec<_> = stream::iter(creates).buffer_unordered(16).collect().await;
        results.into_iter().collect::<kube::Result<Vec<()>>>()?;
        Ok::<f64, anyhow::Error>(start.elapsed().as_secs_f64())
    };
    let (secs, registered) = tokio::try_join!(provisioned, register)?;
    println!("  (registering the {n} Clusters took {registered:.1} s of that)");
    settle(hub).await;
    phases.push(Phase::new(
        "provision",
        secs,
        &before,
        &snap(hub, &pids),
        &pids,
    ));

    // Fan-out: sources first, then the Bundle; timed from the Bundle's creation.
    let secrets: Api<Secret> = Api::namespaced(admin.clone(), WORKSPACE);
    let source = secrets.create(&pp, &secret(1)).await?;
    let settings = Api::<ConfigMap>::namespaced(admin.clone(), WORKSPACE)
        .create(&pp, &config_map())
        .await?;
    let s_hash = hash::secret_hash(&source);
    let c_hash = hash::config_map_hash(&settings);
    let bds: Api<BundleDeployment> = Api::all(admin.clone());
    let secret_copies: Api<PartialObjectMeta<Secret>> = Api::all(admin.clone());
    let copies = format!(",{}", labels::BUNDLE_NAME);
    // Every BundleDeployment and every copy: N per Bundle.
    let nb = n * bundles;
    let before = snap(hub, &pids);
    let start = Instant::now();
    for b in 0..bundles {
        Api::<Bundle>::namespaced(admin.clone(), WORKSPACE)
            .create(&pp, &bundle(&bundle_name(b)))
            .await?;
    }
    let (t_bd, t_secret, t_cm) = tokio::try_join!(
        wait_all(
            "BundleDeployments",
            bds.clone(),
            in_ws(""),
            nb,
            start,
            timeout,
            |bd| lists_copy(bd, "creds") && lists_copy(bd, "settings"),
        ),
        wait_all(
            "Secret copies",
            secret_copies.clone(),
            in_ws(&copies),
            nb,
            start,
            timeout,
            |m| has_hash(m, &s_hash),
        ),
        wait_all(
            "ConfigMap copies",
            Api::<PartialObjectMeta<ConfigMap>>::all(admin.clone()),
            in_ws(&copies),
            nb,
            start,
            timeout,
            |m| has_hash(m, &c_hash),
        ),
    )?;
    println!(
        "  (fan-out: BundleDeployments complete at {t_bd:.1} s, Secret copies {t_secret:.1} s, ConfigMap copies {t_cm:.1} s)"
    );
    settle(hub).await;
    let secs = t_bd.max(t_secret).max(t_cm);
    phases.push(Phase::new(
        "fan-out",
        secs,
        &before,
        &snap(hub, &pids),
        &pids,
    ));
    // The baseline's third object is as large as one BundleDeployment's spec.
    let one_bd = ListParams::default()
        .labels(&format!("{}={WORKSPACE}", labels::WORKSPACE))
        .limit(1);
    let one = bds.list(&one_bd).await?;
    let bd = one.items.first().context("no BundleDeployment")?;
    let first_bd = bd.clone();
    let bd_bytes = serde_json::to_vec(&bd.spec)?.len();
    let bd_stored = serde_json::to_vec(bd)?.len();
    println!(
        "  (a BundleDeployment: spec {bd_bytes} bytes, {bd_stored} bytes stored with metadata and managedFields)"
    );
    let replicas = replica_caches(&admin, k, n).await?;
    for r in &replicas {
        println!(
            "  (replica {}: {} Clusters; caches {} BundleDeployments, {} copies, {} namespaces = {:.1} MB as JSON)",
            r.shard.as_deref().unwrap_or("unsharded"),
            r.clusters,
            r.bundle_deployments,
            r.copies,
            r.namespaces,
            r.bytes as f64 / 1e6,
        );
    }
    let mut baselines = Vec::new();
    let mut anatomy = Vec::new();
    if with_baseline {
        baselines.push(baseline::fan_out(&admin, &pids, n, bd_bytes).await?);
    }

    // Rotation: only the Secret changes.
    let rotate = |version: u32| {
        let (secrets, secret_copies, config) =
            (secrets.clone(), secret_copies.clone(), in_ws(&copies));
        let pids = &pids;
        async move {
            let before = snap(hub, pids);
            let start = Instant::now();
            let patch = Patch::Merge(serde_json::json!({"data": secret(version).data}));
            let rotated = secrets
                .patch("creds", &PatchParams::default(), &patch)
                .await?;
            let s_hash = hash::secret_hash(&rotated);
            // Signed copies (decision 0089-signed-copies): the rotation is the copies alone;
            // the invariant below fails if any BundleDeployment is written.
            let secs = wait_all(
                "rotated Secret copies",
                secret_copies,
                config,
                nb,
                start,
                timeout,
                |m| has_hash(m, &s_hash),
            )
            .await?;
            settle(hub).await;
            Ok::<Phase, anyhow::Error>(Phase::new(
                "rotation",
                secs,
                &before,
                &snap(hub, pids),
                pids,
            ))
        }
    };
    phases.push(rotate(2).await?);
    if with_baseline {
        baselines.push(baseline::rotation(&admin, &pids, n, 2).await?);
        let one = bds.list(&one_bd).await?;
        let rotated = one.items.first().context("no BundleDeployment")?;
        let (create, apply) =
            baseline::bundle_deployments(&admin, &pids, n, &first_bd, rotated).await?;
        baselines.extend([create, apply]);
        anatomy = baseline::write_anatomy(&admin, &pids, n, &first_bd, rotated).await?;
        // Where a rotation's cost goes: the observer, and the copy's shape (#26).
        anatomy.push((
            "a plain Secret, apply (change), not watched (the baseline before 2026-12-02)".into(),
            baseline::rotation_unobserved(&admin, &pids, n).await?,
        ));
        let real = Api::<Secret>::all(admin.clone())
            .list(
                &ListParams::default()
                    .labels(&format!("{}={WORKSPACE}{copies}", labels::WORKSPACE))
                    .limit(1),
            )
            .await?;
        let real = real.items.first().context("no Secret copy")?;
        anatomy.extend(baseline::copy_anatomy(&admin, &pids, n, real).await?);
    }

    // Idle: nothing changes; the hub must not write.
    let before = snap(hub, &pids);
    tokio::time::sleep(Duration::from_secs(args.idle_seconds)).await;
    let secs = args.idle_seconds as f64;
    phases.push(Phase::new("idle", secs, &before, &snap(hub, &pids), &pids));

    // Rotation pairs: one sample of a ratio on a shared machine moves by half of itself
    // between runs; a median over pairs, each hub rotation beside its own baseline, does not.
    let mut pairs = Vec::new();
    if with_baseline {
        for r in 0..args.rotation_pairs {
            let hub_phase = rotate(3 + r).await?;
            pairs.push((
                hub_phase,
                baseline::rotation(&admin, &pids, n, 3 + r).await?,
            ));
        }
    }

    for p in &phases {
        p.print(n);
    }
    for (p, b) in phases[1..3].iter().zip(&baselines) {
        compare(p, b);
    }
    if let [_, _, create, apply] = baselines.as_slice() {
        println!(
            "  BundleDeployments alone (N real ones, no hub, server-side apply): create {:.1} s, apiserver {:.2} ms/write; rotated spec {:.1} s, apiserver {:.2} ms/write",
            create.secs,
            ms_per_write(create.cpu[1], create.writes),
            apply.secs,
            ms_per_write(apply.cpu[1], apply.writes),
        );
    }
    for (what, b) in &anatomy {
        println!(
            "  write anatomy, {what}: {:.1} s, apiserver {:.2} ms/write",
            b.secs,
            ms_per_write(b.cpu[1], b.writes),
        );
    }
    if !pairs.is_empty() {
        let cpu: Vec<String> = pairs
            .iter()
            .map(|(p, b)| ratio(p.cpu[1], b.cpu[1]))
            .collect();
        println!(
            "  rotation pairs, apiserver CPU hub / baseline: {} | median {} (with the first rotation) | wall median {}",
            cpu.join(" "),
            ratio(
                pair_median(
                    &phases[2],
                    &baselines[1],
                    &pairs,
                    |x| x.cpu[1],
                    |b| b.cpu[1]
                ),
                1.0
            ),
            ratio(
                pair_median(&phases[2], &baselines[1], &pairs, |x| x.secs, |b| b.secs),
                1.0
            ),
        );
    }
    let (rotation, idle) = (&phases[2], &phases[3]);
    let copy_writes = rotation.count(|v, r| v == "patch" && r == "secrets");
    let bd_writes = rotation.count(|v, r| v == "patch" && r == "bundledeployments");
    let mut failed = Vec::new();
    let mut check = |ok: bool, what: String| {
        if !ok {
            failed.push(format!("N={n}: {what}"));
        }
        if ok { "OK" } else { "FAILED" }
    };
    let rotation_line = format!(
        "rotation: {} writes = {copy_writes} Secret copies + {bd_writes} BundleDeployments + {} other (expected clusters x Bundles x 1 changed source = {} copies and no BundleDeployment)",
        rotation.writes(),
        rotation.writes() - copy_writes - bd_writes,
        nb,
    );
    let verdict = check(
        rotation.writes() == nb as u64 && copy_writes == nb as u64 && bd_writes == 0,
        rotation_line.clone(),
    );
    println!("  {rotation_line} {verdict}");
    let off: Vec<u64> = pairs
        .iter()
        .map(|(p, _)| p.writes())
        .filter(|w| *w != nb as u64)
        .collect();
    if !pairs.is_empty() {
        let line = format!(
            "rotation pairs: {} more rotations, every one {nb} writes (off: {off:?})",
            pairs.len()
        );
        let verdict = check(off.is_empty(), line.clone());
        println!("  {line} {verdict}");
    }
    let idle_line = format!(
        "idle {} s: {} writes (expected 0)",
        args.idle_seconds,
        idle.writes()
    );
    let verdict = check(idle.writes() == 0, idle_line.clone());
    println!("  {idle_line} {verdict}");
    for h in hubs {
        h.stop().await?;
    }
    drop(env);
    Ok(Size {
        n,
        shards: k,
        replicas,
        bundles,
        peak_rss: mem_mb(None, "VmHWM"),
        phases,
        rss_before,
        baselines,
        anatomy,
        pairs,
        bd_bytes,
        failed,
    })
}

/// The median over the first rotation and every pair of `hub(phase) / base(baseline)`.
fn pair_median(
    first: &Phase,
    first_baseline: &Baseline,
    pairs: &[(Phase, Baseline)],
    hub: impl Fn(&Phase) -> f64,
    base: impl Fn(&Baseline) -> f64,
) -> f64 {
    let mut r: Vec<f64> = std::iter::once((first, first_baseline))
        .chain(pairs.iter().map(|(p, b)| (p, b)))
        .map(|(p, b)| hub(p) / base(b))
        .collect();
    r.sort_by(f64::total_cmp);
    r[r.len() / 2]
}

/// One size's results.
struct Size {
    n: usize,
    /// Hub replicas (1: unsharded only).
    shards: usize,
    /// What each replica caches.
    replicas: Vec<ReplicaCache>,
    bundles: usize,
    /// The bench process's VmHWM after this size (the process peak so far).
    peak_rss: f64,
    phases: Vec<Phase>,
    rss_before: f64,
    /// Fan-out and rotation baselines, then N real BundleDeployments created and applied
    /// (empty with `--no-baseline`).
    baselines: Vec<Baseline>,
    /// The same spec written other ways (`baseline::write_anatomy`; empty without baseline).
    anatomy: Vec<(String, Baseline)>,
    /// More rotations after the idle window, each beside its baseline (`--rotation-pairs`).
    pairs: Vec<(Phase, Baseline)>,
    bd_bytes: usize,
    failed: Vec<String>,
}

/// Milliseconds of apiserver CPU per write.
fn ms_per_write(cpu: f64, writes: u64) -> f64 {
    if writes == 0 {
        0.0
    } else {
        cpu * 1000.0 / writes as f64
    }
}

/// One hub phase beside its baseline.
fn compare(p: &Phase, b: &Baseline) {
    let (hub_w, base_w) = (p.writes(), b.writes);
    println!(
        "  {:<9} vs baseline: wall {:.1} s / {:.1} s = {} | writes {hub_w} / {base_w} | apiserver CPU {:.1} s / {:.1} s = {} | apiserver ms/write {:.2} / {:.2} = {} | etcd CPU {:.1} s / {:.1} s",
        p.name,
        p.secs,
        b.secs,
        ratio(p.secs, b.secs),
        p.cpu[1],
        b.cpu[1],
        ratio(p.cpu[1], b.cpu[1]),
        ms_per_write(p.cpu[1], hub_w),
        ms_per_write(b.cpu[1], base_w),
        ratio(
            ms_per_write(p.cpu[1], hub_w),
            ms_per_write(b.cpu[1], base_w)
        ),
        p.cpu[2],
        b.cpu[2],
    );
}

fn cpu_json(c: &[f64; 4]) -> serde_json::Value {
    serde_json::json!({"bench": c[0], "apiserver": c[1], "etcd": c[2], "kcm": c[3]})
}

/// A size's figures as JSON.
fn size_json(s: &Size) -> serde_json::Value {
    let phases: Vec<_> = s
        .phases
        .iter()
        .map(|p| {
            let requests: BTreeMap<String, u64> = p
                .requests
                .iter()
                .map(|((v, r), n)| (format!("{v} {r}"), *n))
                .collect();
            serde_json::json!({
                "phase": p.name, "seconds": p.secs, "writes": p.writes(), "requests": requests,
                "reconciles": {"cluster": p.reconciles[0], "bundle": p.reconciles[1],
                               "failed": p.reconciles[2]},
                "cpu_s": cpu_json(&p.cpu),
                "apiserver_ms_per_write": ms_per_write(p.cpu[1], p.writes()),
                "bench_rss_mb": p.rss, "apiserver_rss_mb": p.apiserver_rss,
            })
        })
        .collect();
    let baselines: Vec<_> = s
        .phases
        .get(1..3)
        .unwrap_or_default()
        .iter()
        .zip(&s.baselines)
        .map(|(p, b)| {
            serde_json::json!({
                "phase": p.name, "seconds": b.secs, "writes": b.writes, "cpu_s": cpu_json(&b.cpu),
                "apiserver_ms_per_write": ms_per_write(b.cpu[1], b.writes),
                "ratio": {"wall": p.secs / b.secs, "apiserver_cpu": p.cpu[1] / b.cpu[1],
                          "apiserver_ms_per_write": ms_per_write(p.cpu[1], p.writes())
                              / ms_per_write(b.cpu[1], b.writes)},
            })
        })
        .collect();
    let replicas: Vec<_> = s
        .replicas
        .iter()
        .map(|r| {
            serde_json::json!({"shard": r.shard, "clusters": r.clusters,
                "bundle_deployments": r.bundle_deployments, "copies": r.copies,
                "namespaces": r.namespaces, "cached_json_bytes": r.bytes})
        })
        .collect();
    serde_json::json!({
        "clusters": s.n, "hub_replicas": s.shards, "replicas": replicas, "bundles": s.bundles,
        "bench_peak_rss_mb_so_far": s.peak_rss, "bench_rss_before_hub_mb": s.rss_before,
        "bundle_deployment_spec_bytes": s.bd_bytes,
        "phases": phases, "baselines": baselines, "failed_invariants": s.failed,
        "bundle_deployments_alone": s.baselines.get(2..4).map(|b| {
            let one = |b: &Baseline| serde_json::json!({"seconds": b.secs, "writes": b.writes,
                "cpu_s": cpu_json(&b.cpu), "apiserver_ms_per_write": ms_per_write(b.cpu[1], b.writes)});
            serde_json::json!({"create": one(&b[0]), "apply_rotated": one(&b[1])})
        }),
        "write_anatomy": s.anatomy.iter().map(|(what, b)| serde_json::json!({
            "what": what, "seconds": b.secs, "writes": b.writes, "cpu_s": cpu_json(&b.cpu),
            "apiserver_ms_per_write": ms_per_write(b.cpu[1], b.writes)})).collect::<Vec<_>>(),
        "rotation_pairs": s.pairs.iter().map(|(p, b)| serde_json::json!({
            "hub": {"seconds": p.secs, "writes": p.writes(), "cpu_s": cpu_json(&p.cpu)},
            "baseline": {"seconds": b.secs, "writes": b.writes, "cpu_s": cpu_json(&b.cpu)},
            "ratio": {"wall": p.secs / b.secs, "apiserver_cpu": p.cpu[1] / b.cpu[1]},
        })).collect::<Vec<_>>(),
        "rotation_median_ratio": (!s.pairs.is_empty() && s.baselines.len() > 1).then(|| {
            serde_json::json!({
                "apiserver_cpu": pair_median(&s.phases[2], &s.baselines[1], &s.pairs, |x| x.cpu[1], |b| b.cpu[1]),
                "wall": pair_median(&s.phases[2], &s.baselines[1], &s.pairs, |x| x.secs, |b| b.secs),
            })
        }),
    })
}

/// Machine and run facts for the JSON file.
fn run_json(args: &[String]) -> serde_json::Value {
    let cpu = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpu
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .map(|l| l.trim_start_matches([' ', '\t', ':']).to_string());
    let loadavg = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    serde_json::json!({
        "command": args.join(" "),
        "unix_time": std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        "cpus": std::thread::available_parallelism().map_or(0, |n| n.get()),
        "cpu_model": model,
        "loadavg_at_end": loadavg.trim(),
        "kubernetes": tender_e2e::KUBERNETES_VERSION,
        "release_build": !cfg!(debug_assertions),
        "allocator": ALLOCATOR,
    })
}

fn ratio(a: f64, b: f64) -> String {
    if b > 0.0 {
        format!("x{:.2}", a / b)
    } else {
        "-".into()
    }
}

fn print_summary(sizes: &[Size]) {
    let results: Vec<(usize, &[Phase], f64)> = sizes
        .iter()
        .map(|s| (s.n, s.phases.as_slice(), s.rss_before))
        .collect();
    // A row's name: N, and the replica count when sharded.
    let row = |i: usize| {
        let s = &sizes[i];
        if s.shards > 1 {
            format!("{}/K{}", s.n, s.shards)
        } else {
            s.n.to_string()
        }
    };
    println!(
        "\n{:>6} | {:>11} {:>9} {:>10} | {:>26} | {:>23} | {:>20} | {:>9}",
        "N",
        "provision s",
        "fan-out s",
        "rotation s",
        "writes prov/fan/rot/idle",
        "ms/cluster prov/fan/rot",
        "bench RSS MB (hub Δ)",
        "apisrv MB"
    );
    for (r, &(n, p, rss_before)) in results.iter().enumerate() {
        let ms = |i: usize| p[i].secs * 1000.0 / n as f64;
        let writes: Vec<String> = p.iter().map(|q| q.writes().to_string()).collect();
        println!(
            "{:>6} | {:>11.1} {:>9.1} {:>10.1} | {:>26} | {:>23} | {:>20} | {:>9.0}",
            row(r),
            p[0].secs,
            p[1].secs,
            p[2].secs,
            writes.join("/"),
            format!("{:.1}/{:.1}/{:.1}", ms(0), ms(1), ms(2)),
            format!("{:.0} (+{:.0})", p[3].rss, p[3].rss - rss_before),
            p[3].apiserver_rss,
        );
    }
    println!("peak bench RSS (VmHWM): {:.0} MB", mem_mb(None, "VmHWM"));

    println!("\nCPU seconds bench/apiserver/etcd/kcm (bench = the hub + the bench's own watches):");
    println!(
        "{:>6} | {:>24} | {:>24} | {:>24}",
        "N", "provision", "fan-out", "rotation"
    );
    for (r, &(_, p, _)) in results.iter().enumerate() {
        let cpu = |q: &Phase| {
            let c = q.cpu;
            format!("{:.1}/{:.1}/{:.1}/{:.1}", c[0], c[1], c[2], c[3])
        };
        println!(
            "{:>6} | {:>24} | {:>24} | {:>24}",
            row(r),
            cpu(&p[0]),
            cpu(&p[1]),
            cpu(&p[2])
        );
    }

    for (r, &(n, p, rss_before)) in results.iter().enumerate().skip(1) {
        // Sharded: against one replica at the same N; otherwise against the smallest N.
        let b = if sizes[r].shards > 1 {
            (0..r).rev().find(|&j| sizes[j].n == n).unwrap_or(0)
        } else {
            0
        };
        let (n0, base, base_rss) = &results[b];
        let scale = n as f64 / *n0 as f64;
        println!(
            "\nN={} vs N={} (x{scale:.0} clusters; per cluster x1.00 = linear):",
            row(r),
            row(b)
        );
        let all = |q: &Phase| q.cpu.iter().sum::<f64>();
        for i in 0..3 {
            println!(
                "  {:<9} wall {} (per cluster {}); CPU per cluster: all {}, bench {}, apiserver {}",
                p[i].name,
                ratio(p[i].secs, base[i].secs),
                ratio(p[i].secs / scale, base[i].secs),
                ratio(all(&p[i]) / scale, all(&base[i])),
                ratio(p[i].cpu[0] / scale, base[i].cpu[0]),
                ratio(p[i].cpu[1] / scale, base[i].cpu[1]),
            );
        }
        let total = |ps: &[Phase]| ps.iter().map(|q| q.writes() as f64).sum::<f64>();
        println!(
            "  writes {}; hub Δ RSS {}; apiserver RSS {}",
            ratio(total(p), total(base)),
            ratio(p[3].rss - rss_before, base[3].rss - base_rss),
            ratio(p[3].apiserver_rss, base[3].apiserver_rss),
        );
    }
}

#[tokio::main]
async fn main() -> Result<()> {
    let mut args = Args::parse();
    args.clusters.sort_unstable();
    args.clusters.dedup();
    if args.clusters.is_empty() || args.clusters[0] == 0 {
        bail!("--clusters needs sizes of at least 1");
    }
    // kube_client logs every non-2xx at error level, including the /readyz polls at start-up.
    tender_runtime::telemetry::init(
        tender_runtime::LogFormat::Text,
        "warn,kube_client=off,kube_runtime=off",
    )?;
    let argv: Vec<String> = std::env::args().collect();
    let write_json = |body: serde_json::Value| -> Result<()> {
        if let Some(path) = &args.json {
            let mut doc = run_json(&argv);
            doc["results"] = body;
            std::fs::write(path, serde_json::to_string_pretty(&doc)? + "\n")
                .with_context(|| format!("writing {}", path.display()))?;
            println!("figures written to {}", path.display());
        }
        Ok(())
    };
    if let Some(n) = args.agents {
        let figures = agents::run(n, &args).await?;
        let failed = figures["failed"].clone();
        write_json(figures)?;
        if failed.as_array().is_some_and(|f| !f.is_empty()) {
            bail!("agents: invariant failed: {failed}");
        }
        return Ok(());
    }
    if let Some(n) = args.waves {
        let figures = waves::run(n, args.soak_seconds, &args).await?;
        let failed = figures["failed"].clone();
        write_json(figures)?;
        if failed.as_array().is_some_and(|f| !f.is_empty()) {
            bail!("waves: invariant failed: {failed}");
        }
        println!("\nall invariants hold");
        return Ok(());
    }
    if !args.peers.is_empty() {
        let figures = peers::run(&args.peers, args.targets, &args).await?;
        let failed = figures["failed"].clone();
        write_json(figures)?;
        if failed.as_array().is_some_and(|f| !f.is_empty()) {
            bail!("peers failed: {failed}");
        }
        return Ok(());
    }
    let mut sizes = Vec::new();
    for &n in &args.clusters {
        sizes.push(run_size(n, 1, &args).await?);
        if args.shards > 1 {
            sizes.push(run_size(n, args.shards, &args).await?);
        }
    }
    print_summary(&sizes);
    let failed: Vec<&String> = sizes.iter().flat_map(|s| &s.failed).collect();
    write_json(serde_json::json!({"sizes": sizes.iter().map(size_json).collect::<Vec<_>>()}))?;
    if !failed.is_empty() {
        for f in &failed {
            eprintln!("invariant failed: {f}");
        }
        bail!("{} benchmark invariant(s) failed", failed.len());
    }
    println!("\nall invariants hold");
    Ok(())
}
