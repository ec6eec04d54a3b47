//! The in-run baseline of the hub phases: a minimal client writing the same number of objects
//! of the same sizes, with the same concurrency, to the same apiserver.
//!
//! The hub reconciles 16 clusters at a time and writes a cluster's objects one after the
//! other; the baseline does the same, one fresh namespace standing in for each cluster
//! namespace (created before the clock starts). Fan-out creates a 3 KB Secret, a 3 KB
//! ConfigMap and a ConfigMap as large as one BundleDeployment's spec per namespace; rotation
//! server-side applies a changed Secret per namespace (N writes, like the hub since decision
//! 0089-signed-copies).

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::time::{Duration, Instant};

use anyhow::Result;
use futures::{StreamExt, stream};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{
    Api, ApiResource, DynamicObject, GroupVersionKind, ObjectMeta, Patch, PatchParams, PostParams,
};
use kube::{Client, CustomResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tender_types::BundleDeployment;

use crate::{Pids, config_map, cpu_now, payload, secret};

/// Clusters the hub reconciles at once (`crates/hub/src/bundle/mod.rs`), and so the
/// baseline's namespaces in flight.
const IN_FLIGHT: usize = 16;
const FIELD_MANAGER: &str = "tender-bench-baseline";

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
    tokio::time::sleep(Duration::from_secs(3) + tender_hub::DEFAULT_CLUSTER_SUMMARY_DELAY).await;
    let after = cpu_now(pids);
    Ok(Baseline {
        secs,
        writes: writes_per_ns * n as u64,
        cpu: [0, 1, 2, 3].map(|i| after[i] - before[i]),
    })
}

/// Fan-out baseline: per namespace, create a 3 KB Secret, a 3 KB ConfigMap and a ConfigMap of
/// `bd_bytes` (3N creates).
pub async fn fan_out(admin: &Client, pids: &Pids, n: usize, bd_bytes: usize) -> Result<Baseline> {
    measure(pids, n, 3, |ns| {
        let secrets: Api<Secret> = Api::namespaced(admin.clone(), &ns);
        let config_maps: Api<ConfigMap> = Api::namespaced(admin.clone(), &ns);
        async move {
            let pp = PostParams::default();
            secrets.create(&pp, &secret(1)).await?;
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
/// what a plain copier writes, and since decision 0089-signed-copies what the hub writes).
pub async fn rotation(admin: &Client, pids: &Pids, n: usize, _bd_bytes: usize) -> Result<Baseline> {
    measure(pids, n, 1, |ns| {
        let secrets: Api<Secret> = Api::namespaced(admin.clone(), &ns);
        async move {
            let pp = PatchParams::apply(FIELD_MANAGER).force();
            let mut s = secret(2);
            s.type_ = Some("Opaque".into());
            secrets.patch("creds", &pp, &Patch::Apply(&s)).await?;
            Ok(())
        }
    })
    .await
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
const ANATOMY_GROUP: &str = "bench.tender.dev";

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
fn variant_crd(kind: &str) -> Result<CustomResourceDefinition> {
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
