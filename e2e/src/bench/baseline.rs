//! The in-run baseline of the hub phases: a minimal client writing the same number of objects
//! of the same sizes, with the same concurrency, to the same apiserver.
//!
//! The hub reconciles 16 clusters at a time and writes a cluster's objects one after the
//! other; the baseline does the same, one fresh namespace standing in for each cluster
//! namespace (created before the clock starts). Fan-out creates a 3 KB Secret, a 3 KB
//! ConfigMap and a ConfigMap as large as one BundleDeployment's spec per namespace; rotation
//! server-side applies a changed Secret per namespace (N writes, like the hub since decision
//! 0089-signed-copies).
//!
//! A hub rotation is timed by a metadata watch that waits for every copy's new content hash
//! (`wait_all`); the rotation baseline is timed by the same kind of watch on its Secrets, so
//! both phases pay the apiserver for one observer and end when the last change was seen.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::time::{Duration, Instant};

use anyhow::Result;
use futures::{StreamExt, stream};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{
    Api, ApiResource, DynamicObject, GroupVersionKind, ObjectMeta, PartialObjectMeta, Patch,
    PatchParams, PostParams,
};
use kube::runtime::watcher;
use kube::{Client, CustomResourceExt, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tender_types::BundleDeployment;

use crate::{Pids, config_map, cpu_now, payload, secret};

/// Clusters the hub reconciles at once (`crates/hub/src/bundle/mod.rs`), and so the
/// baseline's namespaces in flight.
const IN_FLIGHT: usize = 16;
const FIELD_MANAGER: &str = "tender-bench-baseline";
/// Label selecting an observed baseline phase's Secrets (value: the phase), and the annotation
/// the observer waits for (value: the content version), as the hub phase waits for each
/// copy's content hash.
const OBSERVED: &str = "bench.tender.dev/observed";
const VERSION: &str = "bench.tender.dev/version";
/// Longest an observed baseline phase may take.
const OBSERVE_TIMEOUT: Duration = Duration::from_secs(600);

/// What one baseline phase cost.
#[derive(Debug, Clone)]
pub struct Baseline {
    /// Seconds until the last write returned, plus the same quiet tail the hub phases wait
    /// for (3 s + the hub's Cluster summary delay; excluded from `secs`, included in `cpu`).
    pub secs: f64,
    pub writes: u64,
    /// CPU seconds: bench, apiserver, etcd, controller-manager.
    pub cpu: [f64; 4],
}

fn namespace(i: usize) -> String {
    format!("baseline-{i:05}")
}

/// Creates the N stand-in cluster namespaces (not measured).
pub async fn namespaces(admin: &Client, n: usize) -> Result<()> {
    let api: Api<Namespace> = Api::all(admin.clone());
    let creates = (0..n).map(|i| {
        let api = api.clone();
        async move {
            let ns = Namespace {
                metadata: ObjectMeta {
                    name: Some(namespace(i)),
                    ..Default::default()
                },
                ..Default::default()
            };
            api.create(&PostParams::default(), &ns).await.map(|_| ())
        }
    });
    let results: Vec<_> = stream::iter(creates)
        .buffer_unordered(IN_FLIGHT)
        .collect()
        .await;
    results.into_iter().collect::<kube::Result<Vec<()>>>()?;
    Ok(())
}

/// A ConfigMap `deployment` whose data is as large as a BundleDeployment spec.
fn deployment_stand_in(version: u32, bytes: usize) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some("deployment".into()),
            ..Default::default()
        },
        data: Some(BTreeMap::from([("spec".into(), payload(version, bytes))])),
        ..Default::default()
    }
}

/// Runs `per_namespace` for every stand-in namespace, 16 at a time, and measures it.
async fn measure<F, Fut>(
    pids: &Pids,
    n: usize,
    writes_per_ns: u64,
    per_namespace: F,
) -> Result<Baseline>
where
    F: Fn(String) -> Fut,
    Fut: Future<Output = kube::Result<()>>,
{
    let before = cpu_now(pids);
    let start = Instant::now();
    let results: Vec<_> = stream::iter((0..n).map(|i| per_namespace(namespace(i))))
        .buffer_unordered(IN_FLIGHT)
        .collect()
        .await;
    results.into_iter().collect::<kube::Result<Vec<()>>>()?;
    let secs = start.elapsed().as_secs_f64();
    Ok(tail(pids, &before, secs, writes_per_ns * n as u64).await)
}

/// The quiet tail every phase waits for, and the CPU spent since `before`.
async fn tail(pids: &Pids, before: &[f64; 4], secs: f64, writes: u64) -> Baseline {
    tokio::time::sleep(Duration::from_secs(3) + tender_hub::DEFAULT_CLUSTER_SUMMARY_DELAY).await;
    let after = cpu_now(pids);
    Baseline {
        secs,
        writes,
        cpu: [0, 1, 2, 3].map(|i| after[i] - before[i]),
    }
}

/// Like [`measure`], one Secret write per namespace, timed by a metadata watch on the Secrets
/// labelled `OBSERVED=phase` until all N carry `VERSION=version` (the hub phases' observer).
async fn measure_observed<F, Fut>(
    admin: &Client,
    pids: &Pids,
    n: usize,
    (phase, version): (&str, &str),
    per_namespace: F,
) -> Result<Baseline>
where
    F: Fn(String) -> Fut,
    Fut: Future<Output = kube::Result<()>>,
{
    let before = cpu_now(pids);
    let what = format!("baseline {phase}");
    let start = Instant::now();
    let seen = crate::wait_all(
        &what,
        Api::<PartialObjectMeta<Secret>>::all(admin.clone()),
        watcher::Config::default().labels(&format!("{OBSERVED}={phase}")),
        n,
        start,
        OBSERVE_TIMEOUT,
        |m| m.annotations().get(VERSION).map(String::as_str) == Some(version),
    );
    let writes = async {
        let results: Vec<_> = stream::iter((0..n).map(|i| per_namespace(namespace(i))))
            .buffer_unordered(IN_FLIGHT)
            .collect()
            .await;
        results.into_iter().collect::<kube::Result<Vec<()>>>()?;
        Ok::<(), anyhow::Error>(())
    };
    let (secs, ()) = tokio::try_join!(seen, writes)?;
    Ok(tail(pids, &before, secs, n as u64).await)
}

/// Marks `secret` as part of observed phase `phase` at content `version`.
fn observed(mut secret: Secret, phase: &str, version: u32) -> Secret {
    secret.labels_mut().insert(OBSERVED.into(), phase.into());
    secret
        .annotations_mut()
        .insert(VERSION.into(), version.to_string());
    secret
}

/// Fan-out baseline: per namespace, create a 3 KB Secret, a 3 KB ConfigMap and a ConfigMap of
/// `bd_bytes` (3N creates).
pub async fn fan_out(admin: &Client, pids: &Pids, n: usize, bd_bytes: usize) -> Result<Baseline> {
    measure(pids, n, 3, |ns| {
        let secrets: Api<Secret> = Api::namespaced(admin.clone(), &ns);
        let config_maps: Api<ConfigMap> = Api::namespaced(admin.clone(), &ns);
        async move {
            let pp = PostParams::default();
            secrets
                .create(&pp, &observed(secret(1), "rotation", 1))
                .await?;
            config_maps.create(&pp, &config_map()).await?;
            config_maps
                .create(&pp, &deployment_stand_in(1, bd_bytes))
                .await?;
            Ok(())
        }
    })
    .await
}

/// Rotation baseline: per namespace, server-side apply the Secret with new data (N applies:
/// what a plain copier writes, and since decision 0089-signed-copies what the hub writes),
/// timed and watched as the hub's rotation is.
pub async fn rotation(admin: &Client, pids: &Pids, n: usize, version: u32) -> Result<Baseline> {
    let v = version.to_string();
    measure_observed(admin, pids, n, ("rotation", &v), |ns| {
        let secrets: Api<Secret> = Api::namespaced(admin.clone(), &ns);
        async move {
            let pp = PatchParams::apply(FIELD_MANAGER).force();
            let mut s = observed(secret(version), "rotation", version);
            s.type_ = Some("Opaque".into());
            secrets.patch("creds", &pp, &Patch::Apply(&s)).await?;
            Ok(())
        }
    })
    .await
}

/// The same rotation unwatched (the baseline before it was observed): what the observer
/// costs the apiserver, written back to version 1.
pub async fn rotation_unobserved(admin: &Client, pids: &Pids, n: usize) -> Result<Baseline> {
    measure(pids, n, 1, |ns| {
        let secrets: Api<Secret> = Api::namespaced(admin.clone(), &ns);
        async move {
            let pp = PatchParams::apply(FIELD_MANAGER).force();
            let mut s = observed(secret(1), "rotation", 1);
            s.type_ = Some("Opaque".into());
            secrets.patch("creds", &pp, &Patch::Apply(&s)).await?;
            Ok(())
        }
    })
    .await
}

/// A Secret shaped as the hub's copy `real` (its type, labels with the `tender.dev/` keys
/// moved to `bench.tender.dev/` so no hub selects them, its annotations, an owner reference
/// to the namespace's stand-in BundleDeployment, its field manager) holding `secret(version)`'s
/// data, with the content-hash and signature annotations changed per version (same lengths).
fn copy_shaped(real: &Secret, owner_uid: &str, version: u32) -> Secret {
    let labels = real
        .labels()
        .iter()
        .map(|(k, v)| (k.replace("tender.dev/", "bench.tender.dev/"), v.clone()))
        .chain([(OBSERVED.to_string(), "copy".to_string())]);
    let mut annotations = real.annotations().clone();
    for key in [
        tender_types::labels::CONTENT_HASH,
        tender_types::labels::HUB_SIGNATURE,
    ] {
        if let Some(value) = annotations.get_mut(key) {
            let mark = format!("{version:04}");
            value.replace_range(
                ..mark.len().min(value.len()),
                &mark[..mark.len().min(value.len())],
            );
        }
    }
    annotations.insert(VERSION.into(), version.to_string());
    let owner_references = real.owner_references().iter().map(|o| {
        let mut o = o.clone();
        o.name = "deployment".into();
        o.uid = owner_uid.into();
        o
    });
    Secret {
        metadata: ObjectMeta {
            name: Some("copy".into()),
            labels: Some(labels.collect()),
            annotations: Some(annotations),
            owner_references: Some(owner_references.collect()),
            ..Default::default()
        },
        type_: real.type_.clone(),
        data: secret(version).data,
        ..Default::default()
    }
}

/// Where a rotation's apiserver cost goes beyond a plain Secret: N copy-shaped Secrets
/// ([`copy_shaped`], one extra label: the observer's) created, then changed, by server-side
/// apply with the hub's field manager, each watched as the hub's copies are; run after
/// [`bundle_deployments`], whose stand-in BundleDeployments own them.
pub async fn copy_anatomy(
    admin: &Client,
    pids: &Pids,
    n: usize,
    real: &Secret,
) -> Result<Vec<(String, Baseline)>> {
    let manager = real
        .managed_fields()
        .iter()
        .find_map(|m| m.manager.clone())
        .unwrap_or_else(|| FIELD_MANAGER.to_string());
    let mut uids = BTreeMap::new();
    for i in 0..n {
        let ns = namespace(i);
        let bd = Api::<BundleDeployment>::namespaced(admin.clone(), &ns)
            .get("deployment")
            .await?;
        uids.insert(ns, bd.uid().unwrap_or_default());
    }
    let (uids, manager) = (&uids, &manager);
    let mut out = Vec::new();
    for (step, version) in [("create", 1), ("change", 2)] {
        let b = measure_observed(admin, pids, n, ("copy", &version.to_string()), |ns| {
            let secrets: Api<Secret> = Api::namespaced(admin.clone(), &ns);
            let body = copy_shaped(real, &uids[&ns], version);
            async move {
                let pp = PatchParams::apply(manager).force();
                secrets.patch("copy", &pp, &Patch::Apply(&body)).await?;
                Ok(())
            }
        })
        .await?;
        out.push((
            format!("a Secret shaped as the hub's copy (labels, annotations, owner, manager), watched, apply ({step})"),
            b,
        ));
    }
    // The same copy without one part of its shape, created then changed: what each part costs.
    type Strip = fn(&mut ObjectMeta);
    let parts: [(&str, &str, Strip); 3] = [
        ("copy-no-owner", "its owner reference", |m| {
            m.owner_references = None
        }),
        ("copy-no-labels", "tender's labels", |m| {
            if let Some(l) = m.labels.as_mut() {
                l.retain(|k, _| k == OBSERVED);
            }
        }),
        ("copy-no-annotations", "tender's annotations", |m| {
            if let Some(a) = m.annotations.as_mut() {
                a.retain(|k, _| k == VERSION);
            }
        }),
    ];
    for (name, part, strip) in parts {
        let mut last = None;
        for version in [1, 2] {
            let b = measure_observed(admin, pids, n, (name, &version.to_string()), |ns| {
                let secrets: Api<Secret> = Api::namespaced(admin.clone(), &ns);
                let mut body = copy_shaped(real, &uids[&ns], version);
                body.metadata.name = Some(name.into());
                body.labels_mut().insert(OBSERVED.into(), name.into());
                strip(&mut body.metadata);
                async move {
                    let pp = PatchParams::apply(manager).force();
                    secrets.patch(name, &pp, &Patch::Apply(&body)).await?;
                    Ok(())
                }
            })
            .await?;
            last = Some(b);
        }
        if let Some(b) = last {
            out.push((
                format!(
                    "a Secret shaped as the hub's copy without {part}, watched, apply (change)"
                ),
                b,
            ));
        }
    }
    // The same change written other ways: what the write method costs, and the observer.
    let merge = measure_observed(admin, pids, n, ("copy", "3"), |ns| {
        let secrets: Api<Secret> = Api::namespaced(admin.clone(), &ns);
        let body = copy_shaped(real, &uids[&ns], 3);
        let patch = serde_json::json!({
            "metadata": {"annotations": body.metadata.annotations},
            "data": body.data,
        });
        async move {
            let pp = PatchParams {
                field_manager: Some(manager.clone()),
                ..Default::default()
            };
            secrets.patch("copy", &pp, &Patch::Merge(&patch)).await?;
            Ok(())
        }
    })
    .await?;
    out.push((
        "a Secret shaped as the hub's copy, watched, JSON merge patch of data and annotations (change)".into(),
        merge,
    ));
    let replace = measure_observed(admin, pids, n, ("copy", "4"), |ns| {
        let secrets: Api<Secret> = Api::namespaced(admin.clone(), &ns);
        let mut body = copy_shaped(real, &uids[&ns], 4);
        async move {
            let live = secrets.get_metadata("copy").await?;
            body.metadata.resource_version = live.resource_version();
            let pp = PostParams {
                field_manager: Some(manager.clone()),
                ..Default::default()
            };
            secrets.replace("copy", &pp, &body).await?;
            Ok(())
        }
    })
    .await?;
    out.push((
        "a Secret shaped as the hub's copy, watched, GET metadata + update (change)".into(),
        replace,
    ));
    let unwatched = measure(pids, n, 1, |ns| {
        let secrets: Api<Secret> = Api::namespaced(admin.clone(), &ns);
        let body = copy_shaped(real, &uids[&ns], 5);
        async move {
            let pp = PatchParams::apply(manager).force();
            secrets.patch("copy", &pp, &Patch::Apply(&body)).await?;
            Ok(())
        }
    })
    .await?;
    out.push((
        "a Secret shaped as the hub's copy, not watched, apply (change)".into(),
        unwatched,
    ));
    Ok(out)
}

/// The BundleDeployment's own share: N server-side applies creating a real BundleDeployment
/// (`first`'s spec), then N server-side applies of `second`'s spec (what a rotation changes), one per stand-in
/// namespace — the same CRD, schema and CEL validation as the hub's writes, without the hub.
pub async fn bundle_deployments(
    admin: &Client,
    pids: &Pids,
    n: usize,
    first: &BundleDeployment,
    second: &BundleDeployment,
) -> Result<(Baseline, Baseline)> {
    let body = |bd: &BundleDeployment| {
        // No labels: the hub's caches select its own objects by label and must not see these.
        BundleDeployment::new("deployment", bd.spec.clone())
    };
    let (first, second) = (body(first), body(second));
    let bds = |ns: &str| Api::<BundleDeployment>::namespaced(admin.clone(), ns);
    let create = patch_each(pids, n, "deployment", &Patch::Apply(&first), bds).await?;
    let apply = patch_each(pids, n, "deployment", &Patch::Apply(&second), bds).await?;
    Ok((create, apply))
}

/// Measures one write of `patch` to object `name` in every stand-in namespace (`api` gives the
/// namespace's API): a server-side apply with the baseline's field manager, or as given.
async fn patch_each<K, P, F>(
    pids: &Pids,
    n: usize,
    name: &str,
    patch: &Patch<P>,
    api: F,
) -> Result<Baseline>
where
    K: Clone + DeserializeOwned + Debug,
    P: Serialize + Debug,
    F: Fn(&str) -> Api<K>,
{
    let pp = if matches!(patch, Patch::Apply(_)) {
        PatchParams::apply(FIELD_MANAGER).force()
    } else {
        PatchParams::default()
    };
    let pp = &pp;
    measure(pids, n, 1, |ns| {
        let api = api(&ns);
        async move { api.patch(name, pp, patch).await.map(|_| ()) }
    })
    .await
}

/// The group of the anatomy's stand-in CRDs, so the hub never sees their objects.
pub(crate) const ANATOMY_GROUP: &str = "bench.tender.dev";

/// Variants of the BundleDeployment CRD under [`ANATOMY_GROUP`], each a kind of its own:
/// the schema as tender ships it, without its CEL rules, without CEL and without
/// `x-kubernetes-embedded-resource` on the manifests, and no schema at all (a spec that
/// preserves unknown fields).
const VARIANTS: [(&str, &str); 4] = [
    ("AsShipped", "the BundleDeployment schema as shipped"),
    ("NoCel", "the same schema without its CEL rules"),
    (
        "NoCelNoEmbedded",
        "the same without CEL and without embedded-resource manifests",
    ),
    ("Schemaless", "no schema (spec preserves unknown fields)"),
];

fn strip(value: &mut serde_json::Value, key: &str) {
    match value {
        serde_json::Value::Object(map) => {
            map.remove(key);
            map.values_mut().for_each(|v| strip(v, key));
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(|v| strip(v, key)),
        _ => {}
    }
}

/// The CRD of anatomy variant `kind`, derived from tender's BundleDeployment CRD.
pub(crate) fn variant_crd(kind: &str) -> Result<CustomResourceDefinition> {
    let mut crd = serde_json::to_value(BundleDeployment::crd())?;
    let plural = format!("{}s", kind.to_lowercase());
    crd["metadata"] = serde_json::json!({"name": format!("{plural}.{ANATOMY_GROUP}")});
    crd["spec"]["group"] = ANATOMY_GROUP.into();
    crd["spec"]["names"] = serde_json::json!({
        "kind": kind, "plural": plural, "singular": kind.to_lowercase(), "listKind": format!("{kind}List")
    });
    let version = &mut crd["spec"]["versions"][0];
    if let Some(map) = version.as_object_mut() {
        map.remove("additionalPrinterColumns");
    }
    let schema = &mut version["schema"]["openAPIV3Schema"];
    match kind {
        "NoCel" => strip(schema, "x-kubernetes-validations"),
        "NoCelNoEmbedded" => {
            strip(schema, "x-kubernetes-validations");
            strip(schema, "x-kubernetes-embedded-resource");
        }
        "Schemaless" => {
            *schema = serde_json::json!({"type": "object", "properties": {
                "spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
                "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}});
        }
        _ => {}
    }
    Ok(serde_json::from_value(crd)?)
}

/// Where a BundleDeployment write's apiserver cost goes: the same spec written N times each
/// way, one object per stand-in namespace, after [`bundle_deployments`] left a
/// BundleDeployment holding `second`'s spec in each:
///
/// - the BundleDeployment changed back to `first` by a JSON merge patch (an update, not an apply);
/// - each [`VARIANTS`] CRD holding the same spec: created (`first`), then changed (`second`),
///   by server-side apply;
/// - a ConfigMap holding the same spec as one data value: created, then changed, by server-side
///   apply.
pub async fn write_anatomy(
    admin: &Client,
    pids: &Pids,
    n: usize,
    first: &BundleDeployment,
    second: &BundleDeployment,
) -> Result<Vec<(String, Baseline)>> {
    let mut out = Vec::new();
    let merge = serde_json::json!({"spec": first.spec});
    out.push((
        "BundleDeployment, JSON merge patch of the spec".to_string(),
        patch_each(pids, n, "deployment", &Patch::Merge(&merge), |ns| {
            Api::<BundleDeployment>::namespaced(admin.clone(), ns)
        })
        .await?,
    ));
    for (kind, what) in VARIANTS {
        crate::install_crd(admin, &variant_crd(kind)?).await?;
        // A new group takes a moment to reach discovery in every apiserver handler.
        tokio::time::sleep(Duration::from_secs(2)).await;
        let resource = ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk(ANATOMY_GROUP, "v1alpha1", kind),
            &format!("{}s", kind.to_lowercase()),
        );
        for (step, bd) in [("create", first), ("change", second)] {
            let body = serde_json::json!({
                "apiVersion": format!("{ANATOMY_GROUP}/v1alpha1"), "kind": kind,
                "metadata": {"name": "deployment"}, "spec": bd.spec
            });
            out.push((
                format!("{what}, apply ({step})"),
                patch_each(pids, n, "deployment", &Patch::Apply(&body), |ns| {
                    Api::<DynamicObject>::namespaced_with(admin.clone(), ns, &resource)
                })
                .await?,
            ));
        }
    }
    for (step, bd) in [("create", first), ("change", second)] {
        let cm = ConfigMap {
            metadata: ObjectMeta {
                name: Some("spec-holder".into()),
                ..Default::default()
            },
            data: Some(BTreeMap::from([(
                "spec".into(),
                serde_json::to_string(&bd.spec)?,
            )])),
            ..Default::default()
        };
        out.push((
            format!("a ConfigMap holding the spec, apply ({step})"),
            patch_each(pids, n, "spec-holder", &Patch::Apply(&cm), |ns| {
                Api::<ConfigMap>::namespaced(admin.clone(), ns)
            })
            .await?,
        ));
    }
    Ok(out)
}
