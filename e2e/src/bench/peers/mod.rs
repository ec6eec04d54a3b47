//! `--peers flux,kyverno`: tender beside a peer on the peer's own workload, same N, same
//! machine, same run (built from the peers' Go modules by `tender_e2e::peers`).
//!
//! - `flux`: a Secret and a ConfigMap pushed to N targets (namespaces spread over two
//!   downstream clusters) — tender with N push Clusters (the hub deploys with a kubeconfig
//!   Secret, as Flux does) against N Flux Kustomizations with `spec.kubeConfig.secretRef`,
//!   fed an `ExternalArtifact` whose tarball the bench serves on loopback (`flux.rs`);
//! - `kyverno`: one Secret cloned into N namespaces of one cluster — tender's namespace
//!   fan-out (`targetNamespaceSelector`) against a Kyverno generate rule with
//!   `synchronize: true` (`kyverno.rs`).
//!
//! Each side is measured the same way: the first deployment (from the first object created
//! until every copy is observed), then rotations one after the other, each from the source
//! write (a Secret patch for tender, a new artifact revision or a source Secret patch for the
//! peer) until the last copy is observed with the new data (watches, as in `agents.rs`); plus
//! CPU seconds of every process involved (from `/proc`) and the requests every apiserver served
//! (`apiserver_request_total`, from the apiservers' own metrics, so both sides are counted
//! alike, whoever the client).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use kube::Client;
use serde_json::{Value, json};
use tender_e2e::{EnvRecord, TestEnv};

use crate::agents::{Seen, percentiles, show, wait_version};
use crate::{Args, cpu_secs, proc_file};

mod artifact;
mod flux;
mod kyverno;

/// Runs the peer phases named in `peers`; returns their figures as JSON.
pub async fn run(peers: &[String], n: usize, args: &Args) -> Result<Value> {
    let mut out = serde_json::Map::new();
    out.insert("targets".into(), json!(n));
    for peer in peers {
        if !["flux", "kyverno"].contains(&peer.as_str()) {
            bail!("unknown peer {peer:?} (known: flux, kyverno)");
        }
    }
    let mut failed = Vec::new();
    for peer in peers {
        let figures = match peer.as_str() {
            "flux" => flux::run(n, args).await,
            _ => kyverno::run(n, args).await,
        };
        // A peer that fails is recorded (and the run fails at the end), the next one still runs.
        match figures {
            Ok(figures) => {
                out.insert(peer.clone(), figures);
            }
            Err(e) => {
                eprintln!("{peer} failed: {e:#}");
                out.insert(peer.clone(), json!({"error": format!("{e:#}")}));
                failed.push(peer.clone());
            }
        }
    }
    out.insert("failed".into(), json!(failed));
    Ok(Value::Object(out))
}

/// The apiserver process of `cluster` (by its etcd prefix), from `env.json`.
fn apiserver_pid(env: &TestEnv, cluster: &str) -> Result<u32> {
    let record: EnvRecord =
        serde_json::from_slice(&std::fs::read(env.state_dir().join("env.json"))?)?;
    record
        .pids
        .iter()
        .copied()
        .find(|p| {
            let cmdline = proc_file(Some(*p), "cmdline");
            cmdline.split('\0').nth(1) == Some("kube-apiserver")
                && cmdline.contains(&format!("--etcd-prefix=/{cluster}\0"))
        })
        .with_context(|| format!("no kube-apiserver of {cluster} in env.json"))
}

/// What the bench reads before and after a measured stretch: processes' CPU and each
/// apiserver's request counters.
pub struct Meter {
    /// Processes by role: "bench" (this process: tender's hub and agents, the bench's
    /// watches), "<cluster> apiserver", the peer's processes.
    procs: Vec<(String, Option<u32>)>,
    apiservers: Vec<(String, Client)>,
}

/// One reading of a [`Meter`].
pub struct Reading {
    at: Instant,
    cpu: Vec<f64>,
    /// Per apiserver: requests by "VERB resource".
    requests: Vec<BTreeMap<String, u64>>,
}

/// Verbs that change state, as `apiserver_request_total` names them.
const WRITES: [&str; 6] = [
    "POST",
    "PUT",
    "PATCH",
    "APPLY",
    "DELETE",
    "DELETECOLLECTION",
];

/// `apiserver_request_total` summed by "VERB resource[/subresource]".
fn request_counts(text: &str) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("apiserver_request_total{") else {
            continue;
        };
        let Some((labels, value)) = rest.rsplit_once("} ") else {
            continue;
        };
        let label = |key: &str| {
            let pat = format!("{key}=\"");
            labels
                .split(',')
                .find_map(|kv| kv.strip_prefix(&pat))
                .map(|v| v.trim_end_matches('"').to_string())
                .unwrap_or_default()
        };
        let (verb, resource, sub) = (label("verb"), label("resource"), label("subresource"));
        // A dry run writes nothing; Flux dry-runs every object before applying it.
        let verb = if label("dry_run").is_empty() {
            verb
        } else {
            format!("DRYRUN-{verb}")
        };
        let key = if sub.is_empty() {
            format!("{verb} {resource}")
        } else {
            format!("{verb} {resource}/{sub}")
        };
        let n = value.trim().parse::<f64>().unwrap_or(0.0) as u64;
        *out.entry(key).or_default() += n;
    }
    out
}

impl Meter {
    /// The bench process and the apiservers of `clusters` (their CPU and their requests).
    pub async fn new(env: &TestEnv, clusters: &[String]) -> Result<Meter> {
        let mut procs = vec![("bench".to_string(), None)];
        let mut apiservers = Vec::new();
        for c in clusters {
            procs.push((format!("{c} apiserver"), Some(apiserver_pid(env, c)?)));
            apiservers.push((c.clone(), env.client(c).await?));
        }
        Ok(Meter { procs, apiservers })
    }

    /// Also measures process `pid` as `role`.
    pub fn add(&mut self, role: &str, pid: u32) {
        self.procs.push((role.to_string(), Some(pid)));
    }

    pub async fn read(&self) -> Result<Reading> {
        let mut requests = Vec::new();
        for (name, client) in &self.apiservers {
            let req = http::Request::get("/metrics").body(Vec::new())?;
            let text = client
                .request_text(req)
                .await
                .with_context(|| format!("reading the metrics of {name}'s apiserver"))?;
            requests.push(request_counts(&text));
        }
        Ok(Reading {
            at: Instant::now(),
            cpu: self.procs.iter().map(|(_, p)| cpu_secs(*p)).collect(),
            requests,
        })
    }

    /// CPU seconds and apiserver requests between two readings, as JSON, and one line each
    /// for the console.
    pub fn between(&self, before: &Reading, after: &Reading) -> (Value, Vec<String>) {
        let cpu: BTreeMap<&str, f64> = self
            .procs
            .iter()
            .enumerate()
            .map(|(i, (role, _))| (role.as_str(), after.cpu[i] - before.cpu[i]))
            .collect();
        let mut lines = vec![format!(
            "CPU s over {:.1} s: {}",
            after.at.duration_since(before.at).as_secs_f64(),
            cpu.iter()
                .map(|(r, c)| format!("{r} {c:.1}"))
                .collect::<Vec<_>>()
                .join(", ")
        )];
        let mut apiservers = serde_json::Map::new();
        for (i, (name, _)) in self.apiservers.iter().enumerate() {
            let delta: BTreeMap<&str, u64> = after.requests[i]
                .iter()
                .map(|(k, n)| {
                    let old = before.requests[i].get(k).copied().unwrap_or(0);
                    (k.as_str(), n.saturating_sub(old))
                })
                .filter(|(k, n)| *n > 0 && !k.ends_with(" leases"))
                .collect();
            let writes: u64 = delta
                .iter()
                .filter(|(k, _)| WRITES.iter().any(|w| k.starts_with(&format!("{w} "))))
                .map(|(_, n)| n)
                .sum();
            let list = delta
                .iter()
                .filter(|(k, _)| WRITES.iter().any(|w| k.starts_with(&format!("{w} "))))
                .map(|(k, n)| format!("{k} {n}"))
                .collect::<Vec<_>>()
                .join(", ");
            lines.push(format!(
                "{name} apiserver: {writes} writes (Leases excluded): {list}"
            ));
            apiservers.insert(name.clone(), json!({"writes": writes, "requests": delta}));
        }
        (
            json!({"cpu_s": cpu, "apiserver_requests": apiservers}),
            lines,
        )
    }
}

/// One side's run on a workload: its first deployment and its rotations.
pub struct Side<'a> {
    pub name: &'static str,
    pub seen: &'a Seen,
    /// The copies this side writes, as the observers key them ("<cluster>/<namespace>").
    pub keys: Vec<String>,
}

impl Side<'_> {
    /// Waits until every copy exists at version 1; returns the seconds since `start`.
    pub async fn first(&self, start: Instant, timeout: Duration) -> Result<f64> {
        let (_, missing) = wait_version(self.seen, &self.keys, 1, start, timeout).await;
        if missing > 0 {
            bail!(
                "{}: first deployment: {missing} of {} copies missing after {timeout:?}",
                self.name,
                self.keys.len()
            );
        }
        let secs = start.elapsed().as_secs_f64();
        println!(
            "  {}: first deployment, every copy present after {secs:.1} s",
            self.name
        );
        Ok(secs)
    }

    /// `rotations` rotations one after the other, each started by `rotate(version)` (the
    /// source write) and done when every copy carries that version; 1 s between rotations.
    /// Returns latencies (ms), per-rotation times to the last copy seen (s) and the copies
    /// that did not carry their rotation within `timeout` (then the time to the last copy is
    /// the time to the last one that did).
    pub async fn rotate<F, Fut>(
        &self,
        rotations: u32,
        timeout: Duration,
        mut rotate: F,
    ) -> Result<Value>
    where
        F: FnMut(u32) -> Fut,
        Fut: std::future::Future<Output = Result<()>>,
    {
        let mut lat = Vec::new();
        let mut last = Vec::new();
        let mut missing = 0;
        for r in 0..rotations {
            let v = 2 + r;
            let start = Instant::now();
            rotate(v).await?;
            let (l, m) = wait_version(self.seen, &self.keys, v, start, timeout).await;
            last.push(l.iter().copied().fold(0.0, f64::max) / 1000.0);
            missing += m;
            lat.extend(l);
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        let p = percentiles(lat);
        show(self.name, &p);
        let mean_last = last.iter().sum::<f64>() / last.len().max(1) as f64;
        println!(
            "  {}: source write -> last copy, per rotation: mean {mean_last:.2} s, max {:.2} s; {missing} copies missed",
            self.name,
            last.iter().copied().fold(0.0, f64::max)
        );
        // A copy that missed a rotation is recorded, not fatal: it is a finding about the side.
        if missing > 0 {
            eprintln!(
                "{}: {missing} copies did not carry their rotation within {timeout:?}",
                self.name
            );
        }
        Ok(
            json!({"rotations": rotations, "latency": p, "last_copy_s": last,
                  "last_copy_mean_s": mean_last, "missing": missing}),
        )
    }
}

/// Prints tender's figures beside the peer's, with ratios (peer / tender: above 1 means
/// tender is faster or cheaper).
pub fn compare(peer: &str, tender: &Value, other: &Value) {
    let f = |v: &Value, path: &[&str]| {
        path.iter()
            .fold(v, |v, k| &v[*k])
            .as_f64()
            .unwrap_or(f64::NAN)
    };
    let row = |what: &str, path: &[&str], unit: &str| {
        let (t, o) = (f(tender, path), f(other, path));
        println!(
            "  {what:<34} tender {t:>9.2}{unit} | {peer} {o:>9.2}{unit} | {peer}/tender x{:.2}",
            o / t
        );
    };
    println!("\n{peer} beside tender (same N, same run):");
    row("first deployment", &["first_s"], " s");
    row(
        "rotation, mean to last copy",
        &["rotations", "last_copy_mean_s"],
        " s",
    );
    row(
        "rotation latency p50",
        &["rotations", "latency", "p50_ms"],
        " ms",
    );
    row(
        "rotation latency p99",
        &["rotations", "latency", "p99_ms"],
        " ms",
    );
    row(
        "rotation latency max",
        &["rotations", "latency", "max_ms"],
        " ms",
    );
}

/// tender's side once its Bundles were created at `start` (after `before`): the first
/// deployment, `args.rotations` rotations of Secret `creds` through `sources`, and the idle
/// window, each with its cost. Returns the JSON fields both peer comparisons report.
pub async fn measure_tender(
    meter: &Meter,
    side: &Side<'_>,
    sources: &kube::Api<k8s_openapi::api::core::v1::Secret>,
    before: Reading,
    start: Instant,
    args: &Args,
) -> Result<serde_json::Map<String, Value>> {
    use kube::api::{Patch, PatchParams};
    let timeout = Duration::from_secs(args.timeout_seconds);
    let first = side.first(start, timeout).await?;
    // Let the first deployment's trailing writes land inside its own cost.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (first_cost, lines) = meter.between(&before, &meter.read().await?);
    print_lines(&lines);
    let before = meter.read().await?;
    let rotations = side
        .rotate(args.rotations, timeout, |v| {
            let sources = sources.clone();
            async move {
                let patch = Patch::Merge(json!({"data": crate::secret(v).data}));
                sources
                    .patch("creds", &PatchParams::default(), &patch)
                    .await?;
                Ok(())
            }
        })
        .await?;
    let (rotation_cost, lines) = meter.between(&before, &meter.read().await?);
    print_lines(&lines);
    let idle_cost = idle(meter, args.idle_seconds).await?;
    let fields = json!({"first_s": first, "first_cost": first_cost, "rotations": rotations,
        "rotation_cost": rotation_cost, "idle_cost": idle_cost});
    Ok(fields.as_object().cloned().unwrap_or_default())
}

/// Measures `secs` of quiet after a side's rotations (nothing changes: a side that still
/// writes is reacting to its own writes or polling).
pub async fn idle(meter: &Meter, secs: u64) -> Result<Value> {
    let before = meter.read().await?;
    tokio::time::sleep(Duration::from_secs(secs)).await;
    let (cost, lines) = meter.between(&before, &meter.read().await?);
    println!("    idle {secs} s:");
    print_lines(&lines);
    Ok(cost)
}

/// Prints a [`Meter::between`]'s lines, indented.
pub fn print_lines(lines: &[String]) {
    for l in lines {
        println!("    {l}");
    }
}
