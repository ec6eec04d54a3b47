//! The agent's removal (the finalizer's cleanup) in-process on the paused clock.

use std::time::Duration;

use http::Method;
use kube::api::DeleteParams;
use serde_json::{Value, json};
use tender_types::labels;

use super::{Agent, TARGET, lines};

const COPY: &str = "app-secret-db-creds";

/// Secret `db-creds` copied, ConfigMaps `app-settings` and `shared` applied.
fn spec(keep: bool) -> Value {
    let cm = |name: &str| {
        json!({"apiVersion": "v1", "kind": "ConfigMap",
               "metadata": {"name": name, "namespace": TARGET}, "data": {"mode": "blue"}})
    };
    json!({
        "deploymentID": "d1",
        "options": {
            "defaultNamespace": TARGET,
            "keepResources": keep,
            "downstreamResources": [{"kind": "Secret", "name": "db-creds", "copyName": COPY}],
        },
        "resources": [cm("app-settings"), cm("shared")],
    })
}

fn get(agent: &Agent, kind: &str, name: &str) -> Option<Value> {
    agent.down.get("v1", kind, Some(TARGET), name)
}

/// An agent that deployed `spec(keep)`; ConfigMaps `shared` (which the Bundle also lists) and
/// `bystander` in the target namespace are somebody else's.
async fn deployed(keep: bool) -> Agent {
    let mut agent = Agent::new(|_| {}).await;
    agent
        .down
        .put(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": TARGET}}));
    for name in ["shared", "bystander"] {
        agent
            .down
            .put(json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": TARGET}, "data": {"theirs": "yes"}}));
    }
    agent.put_copy("app", "db-creds", COPY, &[("password", "s3cret")]);
    agent.put_bd("app", spec(keep));
    agent.start();
    agent.run_for(Duration::from_secs(1)).await;
    for (kind, name) in [("Secret", "db-creds"), ("ConfigMap", "app-settings")] {
        let ours = get(&agent, kind, name).unwrap_or_else(|| panic!("{name} deployed"));
        assert_eq!(
            ours["metadata"]["annotations"][labels::OWNER_ANNOTATION],
            agent.owner("app")
        );
    }
    assert_eq!(
        get(&agent, "ConfigMap", "shared").unwrap()["data"]["theirs"],
        "yes"
    );
    agent
}

/// Deletes BundleDeployment `app` on the hub (as the hub does) and lets the agent clean up;
/// returns the downstream writes of the cleanup.
async fn remove(agent: &Agent) -> Vec<tender_runtime::fake::Recorded> {
    let mark = agent.down.mark();
    agent
        .ctx
        .bds
        .delete("app", &DeleteParams::default())
        .await
        .expect("deleted on the hub");
    agent.run_for(Duration::from_secs(1)).await;
    assert!(
        agent
            .hub
            .get(
                tender_types::API_GROUP_VERSION,
                "BundleDeployment",
                Some(&agent.cluster_namespace()),
                "app"
            )
            .is_none(),
        "the finalizer released"
    );
    agent.down.writes_since(mark)
}

#[tokio::test(start_paused = true)]
async fn removal_with_keep_resources_deletes_nothing_but_the_inventory() {
    let agent = deployed(true).await;
    let writes = remove(&agent).await;

    let deletes: Vec<String> = writes
        .iter()
        .filter(|r| r.method == Method::DELETE)
        .map(ToString::to_string)
        .collect();
    assert_eq!(deletes.len(), 1, "{deletes:?}");
    assert!(
        deletes[0]
            .starts_with("DELETE /api/v1/namespaces/tender-system/configmaps/tender-inventory-"),
        "{deletes:?}"
    );
    // Left in place, without tender's metadata (nothing would ever clean them up).
    for (kind, name) in [("Secret", "db-creds"), ("ConfigMap", "app-settings")] {
        let left = get(&agent, kind, name).unwrap_or_else(|| panic!("{name} kept"));
        assert!(
            left["metadata"]["annotations"]
                .get(labels::OWNER_ANNOTATION)
                .is_none(),
            "{left}"
        );
    }
    assert_eq!(
        get(&agent, "Secret", "db-creds").unwrap()["data"]["password"],
        "czNjcmV0"
    );
    // Theirs untouched.
    let touched: Vec<String> = lines(&writes)
        .into_iter()
        .filter(|w| w.ends_with("/shared") || w.ends_with("/bystander"))
        .collect();
    assert_eq!(touched, Vec::<String>::new());
}

#[tokio::test(start_paused = true)]
async fn removal_deletes_tenders_objects_and_nothing_of_anyone_else() {
    let agent = deployed(false).await;
    let shared = get(&agent, "ConfigMap", "shared").unwrap();
    let bystander = get(&agent, "ConfigMap", "bystander").unwrap();
    let writes = remove(&agent).await;

    let mut deletes: Vec<String> = writes
        .iter()
        .filter(|r| r.method == Method::DELETE)
        .map(ToString::to_string)
        .collect();
    deletes.sort();
    assert_eq!(deletes.len(), 3, "{deletes:#?}");
    assert!(deletes[0].starts_with("DELETE /api/v1/namespaces/app/configmaps/app-settings"));
    assert!(deletes[1].starts_with("DELETE /api/v1/namespaces/app/secrets/db-creds"));
    assert!(
        deletes[2]
            .starts_with("DELETE /api/v1/namespaces/tender-system/configmaps/tender-inventory-")
    );
    assert!(get(&agent, "Secret", "db-creds").is_none());
    assert!(get(&agent, "ConfigMap", "app-settings").is_none());
    // Somebody else's objects, the one the Bundle also listed included, byte for byte as
    // they were; the namespace stays.
    assert_eq!(get(&agent, "ConfigMap", "shared"), Some(shared));
    assert_eq!(get(&agent, "ConfigMap", "bystander"), Some(bystander));
    assert!(agent.down.get("v1", "Namespace", None, TARGET).is_some());
    assert!(
        writes
            .iter()
            .all(|r| !r.path.ends_with("/shared") && !r.path.ends_with("/bystander")),
        "{:?}",
        lines(&writes)
    );
}
