//! `tender-bench --waves N`: a rotation of a copied Secret through 4 waves of N/4 Clusters
//! (docs/rollouts.md), no agents: the bench plays them, marking each BundleDeployment ready at
//! its deploymentID as soon as it sees it change, so the figures are the hub's gating and
//! writes, not agents'. Prints per wave when its first and last BundleDeployment were released
//! and when its last was ready; checks that no wave was released before the previous one was
//! ready and had soaked, and what the rotation wrote.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use futures::{StreamExt, stream};
use k8s_openapi::api::core::v1::{Namespace, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::{Value, json};
use tender_e2e::crds::install_crds;
use tender_e2e::hub_harness::{hub_config, start_hub};
use tender_e2e::{EnvOptions, HUB, TestEnv};
use tender_types::conditions::{TYPE_ROLLOUT_PROGRESSING, find_condition, reason};
use tender_types::rollout::{Partition, RolloutStrategy};
use tender_types::{Bundle, BundleDeployment, Cluster, ClusterSpec, hash, labels};

use super::{Args, BUNDLE, WORKSPACE};

const WAVES: usize = 4;

/// Per cluster: when its BundleDeployment was first seen naming the new copy, and when the
/// bench marked it ready.
#[derive(Default)]
struct Times {
    released: BTreeMap<String, Instant>,
    ready: BTreeMap<String, Instant>,
}

fn wave_of(i: usize) -> usize {
    1 + i % WAVES
}

/// Plays every agent. A rotation writes a cluster's copies and not its BundleDeployment
/// (decision 0089-signed-copies), so the player follows both: on any event in a cluster
/// namespace it reads the BundleDeployment and the content hash of each copy it lists, and
/// reports it applied (`appliedCopiesID`, as an agent would) and ready. A cluster whose `creds`
/// copy holds hash `new` (once set) is timed: released when first seen, ready when reported.
fn play_agents(
    admin: kube::Client,
    new_hash: Arc<Mutex<Option<String>>>,
    times: Arc<Mutex<Times>>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let selector = format!("{}={WORKSPACE}", labels::WORKSPACE);
        let config = watcher::Config::default().labels(&selector);
        let bd_events =
            watcher::watcher(Api::<BundleDeployment>::all(admin.clone()), config.clone())
                .default_backoff()
                .map(|e| match e {
                    Ok(watcher::Event::Apply(o) | watcher::Event::InitApply(o)) => {
                        o.metadata.namespace
                    }
                    _ => None,
                });
        let copy_events = watcher::watcher(
            Api::<kube::core::PartialObjectMeta<Secret>>::all(admin.clone()),
            config,
        )
        .default_backoff()
        .map(|e| match e {
            Ok(watcher::Event::Apply(o) | watcher::Event::InitApply(o)) => o.metadata.namespace,
            _ => None,
        });
        let mut touched = stream::select(bd_events.boxed(), copy_events.boxed());
        while let Some(ns) = touched.next().await {
            let Some(ns) = ns else { continue };
            let want = new_hash.lock().unwrap().clone();
            let _ = play_one(&admin, &ns, want.as_deref(), &times).await;
        }
    })
}

/// One cluster namespace: see [`play_agents`].
async fn play_one(
    admin: &kube::Client,
    ns: &str,
    want: Option<&str>,
    times: &Mutex<Times>,
) -> Result<(), kube::Error> {
    let bds: Api<BundleDeployment> = Api::namespaced(admin.clone(), ns);
    let Some(bd) = bds.get_opt(BUNDLE).await? else {
        return Ok(());
    };
    let cluster = bd
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(labels::CLUSTER).cloned())
        .unwrap_or_default();
    let mut hashes = Vec::new();
    let mut creds = None;
    for entry in &bd.spec.options.downstream_resources {
        let annotations = if entry.kind == "Secret" || entry.is_carried() {
            Api::<Secret>::namespaced(admin.clone(), ns)
                .get_metadata_opt(&entry.copy_name)
                .await?
                .map(|m| m.metadata.annotations)
        } else {
            Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(admin.clone(), ns)
                .get_metadata_opt(&entry.copy_name)
                .await?
                .map(|m| m.metadata.annotations)
        };
        let Some(hash) = annotations
            .flatten()
            .and_then(|a| a.get(labels::CONTENT_HASH).cloned())
        else {
            return Ok(()); // a copy not written yet: an agent would wait too
        };
        if entry.name == "creds" {
            creds = Some(hash.clone());
        }
        hashes.push((entry.copy_name.clone(), hash));
    }
    let rotated = want.is_some() && creds.as_deref() == want;
    if rotated {
        times
            .lock()
            .unwrap()
            .released
            .entry(cluster.clone())
            .or_insert_with(Instant::now);
    }
    let id = bd.spec.deployment_id.clone();
    let copies_id =
        hash::effective_deployment_id(&id, hashes.iter().map(|(c, h)| (c.as_str(), h.as_str())));
    let status = bd.status.as_ref();
    if status.and_then(|s| s.applied_copies_id.as_deref()) == Some(copies_id.as_str())
        && status.and_then(|s| s.applied_deployment_id.as_deref()) == Some(id.as_str())
    {
        return Ok(());
    }
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    let cond = |t: &str| {
        json!({"type": t, "status": "True", "reason": t, "message": "",
               "lastTransitionTime": now})
    };
    let body = json!({"status": {"appliedDeploymentID": id, "appliedCopiesID": copies_id,
        "conditions": [cond("Ready"), cond("Deployed"), cond("ResourcesCopied")]}});
    bds.patch_status(BUNDLE, &PatchParams::default(), &Patch::Merge(&body))
        .await?;
    if rotated {
        times
            .lock()
            .unwrap()
            .ready
            .entry(cluster)
            .or_insert_with(Instant::now);
    }
    Ok(())
}

async fn rollout_complete(admin: &kube::Client, timeout: Duration) -> Result<()> {
    let api: Api<Bundle> = Api::namespaced(admin.clone(), WORKSPACE);
    let deadline = Instant::now() + timeout;
    loop {
        let b = api.get(BUNDLE).await?;
        let done = b
            .status
            .as_ref()
            .and_then(|s| find_condition(&s.conditions, TYPE_ROLLOUT_PROGRESSING))
            .is_some_and(|c| c.reason == reason::ROLLOUT_COMPLETE);
        if done {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("rollout not complete after {timeout:?}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Runs the waves benchmark over `n` Clusters with `soak` seconds of soak per wave.
pub async fn run(n: usize, soak: u32, args: &Args) -> Result<Value> {
    let timeout = Duration::from_secs(args.timeout_seconds);
    let env = TestEnv::start(EnvOptions::default()).await?;
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
    let hubs = vec![start_hub(&env, hub_config(WORKSPACE)).await?];
    let clusters: Api<Cluster> = Api::namespaced(admin.clone(), WORKSPACE);
    let start = Instant::now();
    let provisioned = super::wait_all(
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
            c.metadata.labels = Some(BTreeMap::from([
                ("env".to_string(), "prod".to_string()),
                ("wave".to_string(), wave_of(i).to_string()),
            ]));
            let api = clusters.clone();
            async move { api.create(&PostParams::default(), &c).await.map(|_| ()) }
        });
        let results: Vec<_> = stream::iter(creates).buffer_unordered(16).collect().await;
        results.into_iter().collect::<kube::Result<Vec<()>>>()?;
        Ok::<(), anyhow::Error>(())
    };
    tokio::try_join!(provisioned, register)?;

    let new_hash = Arc::new(Mutex::new(None));
    let times = Arc::new(Mutex::new(Times::default()));
    let player = play_agents(admin.clone(), new_hash.clone(), times.clone());
    let secrets: Api<Secret> = Api::namespaced(admin.clone(), WORKSPACE);
    secrets.create(&pp, &super::secret(1)).await?;
    Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(admin.clone(), WORKSPACE)
        .create(&pp, &super::config_map())
        .await?;
    let mut bundle = super::bundle(BUNDLE);
    bundle.spec.rollout_strategy = Some(RolloutStrategy {
        partitions: (1..=WAVES)
            .map(|w| Partition {
                name: Some(format!("wave-{w}")),
                cluster_selector: Some(LabelSelector {
                    match_labels: Some(BTreeMap::from([("wave".into(), w.to_string())])),
                    ..Default::default()
                }),
                ..Default::default()
            })
            .collect(),
        soak_seconds: Some(soak),
        progress_deadline_seconds: Some(600),
        ..Default::default()
    });
    Api::<Bundle>::namespaced(admin.clone(), WORKSPACE)
        .create(&pp, &bundle)
        .await?;
    rollout_complete(&admin, timeout).await?;
    super::settle(&hubs).await;

    // The rotation, timed from the source's change.
    let v2 = super::secret(2);
    *new_hash.lock().unwrap() = Some(hash::secret_hash(&v2));
    let before = super::writes(&hubs);
    let start = Instant::now();
    secrets
        .patch(
            "creds",
            &PatchParams::apply("bench").force(),
            &Patch::Apply(&v2),
        )
        .await?;
    // Every cluster ready at the new content, then the last wave's soak over.
    while times.lock().unwrap().ready.len() < n {
        if start.elapsed() > timeout {
            bail!("rotation not ready on every cluster after {timeout:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let all_ready = start.elapsed().as_secs_f64();
    rollout_complete(&admin, timeout).await?;
    let total = start.elapsed().as_secs_f64();
    super::settle(&hubs).await;
    let wrote = super::writes(&hubs) - before;
    player.abort();

    let t = times.lock().unwrap();
    let at = |i: &Instant| i.saturating_duration_since(start).as_secs_f64();
    let mut failed = Vec::new();
    let mut rows = Vec::new();
    let mut previous_ready: Option<f64> = None;
    for w in 1..=WAVES {
        let members: Vec<String> = (0..n)
            .filter(|i| wave_of(*i) == w)
            .map(|i| format!("c-{i:05}"))
            .collect();
        let released: Vec<f64> = members
            .iter()
            .filter_map(|c| t.released.get(c))
            .map(at)
            .collect();
        let ready: Vec<f64> = members
            .iter()
            .filter_map(|c| t.ready.get(c))
            .map(at)
            .collect();
        if released.len() != members.len() || ready.len() != members.len() {
            failed.push(format!(
                "wave {w}: {}/{} released, {}/{} ready",
                released.len(),
                members.len(),
                ready.len(),
                members.len()
            ));
            continue;
        }
        let first = released.iter().copied().fold(f64::MAX, f64::min);
        let last = released.iter().copied().fold(0.0, f64::max);
        let done = ready.iter().copied().fold(0.0, f64::max);
        if let Some(p) = previous_ready
            && first < p + f64::from(soak)
        {
            failed.push(format!(
                "wave {w} released at {first:.2} s, before wave {} was ready ({p:.2} s) + soak {soak} s",
                w - 1
            ));
        }
        println!(
            "  wave {w}: {} clusters released {first:.2}–{last:.2} s, all ready {done:.2} s",
            members.len()
        );
        rows.push(
            json!({"wave": w, "clusters": members.len(), "first_released_s": first,
                         "last_released_s": last, "ready_s": done}),
        );
        previous_ready = Some(done);
    }
    // A copy and a BundleDeployment per cluster, the rollout Secret and the Bundle's status a
    // few times per wave, one Event per wave transition.
    let expected = 2 * n;
    let other = wrote.saturating_sub(expected as u64);
    println!(
        "N={n}, {WAVES} waves, soak {soak} s: every cluster ready at {all_ready:.1} s, rollout complete (last soak over) at {total:.1} s; {wrote} writes = {expected} copies and BundleDeployments + {other} other (rollout Secret, Bundle status, Events)"
    );
    if wrote < expected as u64 || other > 16 * WAVES as u64 {
        failed.push(format!(
            "rotation wrote {wrote}, expected {expected} + at most {}",
            16 * WAVES
        ));
    }
    for f in &failed {
        eprintln!("invariant failed: {f}");
    }
    Ok(
        json!({"clusters": n, "waves": WAVES, "soak_s": soak, "ready_s": all_ready, "total_s": total,
              "writes": wrote, "per_wave": rows, "failed": failed}),
    )
}
