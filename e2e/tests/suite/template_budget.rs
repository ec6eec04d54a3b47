//! Issue 36, part 2: a Bundle writer of workspace A puts `range` nested five deep over 1 001
//! entries each in Helm values, one Bundle per hub worker thread and more. Values templates run
//! within a budget of steps and time, on blocking threads, never on the hub's async workers
//! (decision 0110-templates-bounded-in-work): each bomb is refused for its cluster with
//! `ValuesTemplateFailed` naming the budget, and workspace B's ordinary Bundle, created while
//! the bombs are there, gets its BundleDeployment, deployed and Ready.
//!
//! The hub runs on a runtime of its own with [`HUB_WORKERS`] worker threads, as a deployed hub
//! has a few: a template run on one of them holds it, and the test's own runtime stays free to
//! see whether the hub still serves workspace B.

use std::time::Instant;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::Api;
use serde_json::json;
use tender_e2e::fixture::{WAIT, Workspace};
use tender_e2e::hub_harness::{HubHandle, hub_config, start_hub};
use tender_e2e::{TestEnv, downstream_name, eventually, shared_env, unique_name};
use tender_types::Bundle;
use tender_types::conditions::{TYPE_READY, find_condition, reason};
use tender_types::template::{MAX_RENDER_TIME, MAX_STEPS};

/// Worker threads of the hub's runtime.
const HUB_WORKERS: usize = 2;
/// Bomb Bundles: more than the hub has worker threads.
const BOMBS: usize = HUB_WORKERS + 2;

/// The hub, running on its own runtime; dropping it stops the hub and leaves the runtime's
/// threads to end in the background (a runtime cannot be dropped inside another).
struct OwnRuntimeHub {
    hub: Option<HubHandle>,
    runtime: Option<tokio::runtime::Runtime>,
}

impl OwnRuntimeHub {
    async fn start(env: &'static TestEnv, config: tender_hub::HubConfig) -> Self {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(HUB_WORKERS)
            .thread_name("e2e-hub-worker")
            .enable_all()
            .build()
            .unwrap();
        let hub = runtime
            .spawn(async move { start_hub(env, config).await })
            .await
            .unwrap()
            .unwrap();
        Self {
            hub: Some(hub),
            runtime: Some(runtime),
        }
    }
}

impl Drop for OwnRuntimeHub {
    fn drop(&mut self) {
        drop(self.hub.take());
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}

/// Helm values whose template is `range` nested `depth` deep over 1 001 entries each, with
/// an empty body: it renders nothing, so no size cap stops it (the issue's bomb).
fn bomb(depth: usize) -> String {
    let open = r#"${ range (splitList "," (repeat 1000 "a,")) }"#;
    format!("{}{}", open.repeat(depth), "${ end }".repeat(depth))
}

fn ready(b: &Bundle) -> Option<Condition> {
    b.status
        .as_ref()
        .and_then(|s| find_condition(&s.conditions, TYPE_READY).cloned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bombs_in_one_workspace_are_refused_by_budget_and_the_other_workspace_is_served() {
    let env = shared_env(1).await;
    let a = Workspace::without_hub(env, "bomb-a").await;
    let b = Workspace::without_hub(env, "bomb-b").await;
    // The hub's home (Lease, signing key) is B's: B's agent is registered with its key.
    let mut config = hub_config(&b.ns);
    config.workspace_namespaces = vec![a.ns.clone(), b.ns.clone()];
    let _hub = OwnRuntimeHub::start(env, config).await;

    a.cluster("a1").await;
    let _b1 = b.agent("b1", &downstream_name(1)).await;

    // Workspace A: the bombs, each a Helm Bundle for a1 with the template in its values.
    let started = Instant::now();
    for i in 0..BOMBS {
        a.bundle(
            &format!("bomb-{i}"),
            json!({
                "helm": {"chart": "app", "repo": "https://charts.invalid", "version": "0.1.0",
                         "values": {"bomb": bomb(5), "plain": "a,a,a"}},
                "targets": [{"clusterName": "a1"}],
            }),
        )
        .await;
    }
    // Workspace B: an ordinary Bundle, new while the bombs are there.
    let target_ns = unique_name("bomb-b-app");
    b.bundle(
        "app",
        json!({
            "targets": [{"clusterName": "b1"}],
            "defaultNamespace": target_ns,
            "resources": [{"apiVersion": "v1", "kind": "ConfigMap",
                           "metadata": {"name": "settings"}, "data": {"k": "v"}}],
        }),
    )
    .await;

    // B is served: its BundleDeployment is written, applied and Ready, and so is the Bundle.
    b.ready("b1", "app").await;
    let b_served = started.elapsed();
    let bundles_b: Api<Bundle> = Api::namespaced(b.hub.clone(), &b.ns);
    eventually("workspace B's Bundle Ready", WAIT, || async {
        let c = ready(&bundles_b.get("app").await?);
        Ok::<_, kube::Error>(c.filter(|c| c.status == "True"))
    })
    .await;

    // Each bomb is refused for a1 with ValuesTemplateFailed naming the budget, never a value.
    let steps = format!("a1: helm.values.bomb: template exceeded its budget of {MAX_STEPS} steps");
    let time = format!(
        "a1: helm.values.bomb: template exceeded its budget of {} ms",
        MAX_RENDER_TIME.as_millis()
    );
    let bundles_a: Api<Bundle> = Api::namespaced(a.hub.clone(), &a.ns);
    for i in 0..BOMBS {
        let name = format!("bomb-{i}");
        let cond = eventually(&format!("{name} ValuesTemplateFailed"), WAIT, || async {
            let c = ready(&bundles_a.get(&name).await?);
            Ok::<_, kube::Error>(c.filter(|c| c.reason == reason::VALUES_TEMPLATE_FAILED))
        })
        .await;
        assert_eq!(cond.status, "False");
        assert!(
            cond.message.contains(&steps) || cond.message.contains(&time),
            "{}",
            cond.message
        );
        assert!(!cond.message.contains("a,"), "{}", cond.message);
        // Nothing is written for a1.
        assert!(a.bds("a1").get_opt(&name).await.unwrap().is_none());
    }
    let bombs_refused = started.elapsed();
    eprintln!(
        "{BOMBS} bombs on a hub of {HUB_WORKERS} workers: workspace B Ready after {b_served:?}, \
         every bomb refused after {bombs_refused:?}"
    );

    // The hub still serves A too: a new Cluster of A gets its namespace.
    a.cluster("a2").await;
}
