//! Copies the agent verifies on their own (issue 26, decision 0089-signed-copies): every copy
//! on the hub carries the hub's signature over its identity and content hash, so a rotation
//! writes only the copy (no BundleDeployment), and a copy edited, forged or replayed on the
//! hub by anyone else is never deployed.

use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;
use tender_e2e::fixture::{WAIT, Workspace, app_bundle, secret_value, settled, stays, wait_secret};
use tender_e2e::hub_harness::{HubHandle, hub_config, start_hub};
use tender_e2e::{downstream_name, eventually, shared_env, unique_name};
use tender_hub::HubConfig;
use tender_types::conditions::{TYPE_RESOURCES_COPIED, find_condition, reason};
use tender_types::{BundleDeployment, labels, names};

/// A workspace with its own hub reading its key Secret every second (roll steps show fast).
async fn workspace(prefix: &str, downstreams: usize) -> (Workspace, HubHandle) {
    let env = shared_env(downstreams).await;
    let ws = Workspace::without_hub(env, prefix).await;
    let config = HubConfig {
        signing_key_poll: Duration::from_secs(1),
        ..hub_config(&ws.ns)
    };
    let hub = start_hub(env, config).await.unwrap();
    (ws, hub)
}

/// The reason of the BundleDeployment's `ResourcesCopied` condition when it is False.
async fn copy_refusal(bds: &Api<BundleDeployment>) -> Option<String> {
    let bd = bds.get("app").await.ok()?;
    let c = find_condition(&bd.status?.conditions, TYPE_RESOURCES_COPIED)?.clone();
    (c.status == "False").then_some(c.reason)
}

/// Someone with write access to the cluster namespace edits the copy's data under the hub's
/// own field manager name (so the hub does not see another writer), keeping every annotation.
async fn edit_as_hub(copies: &Api<Secret>, name: &str, patch: serde_json::Value) {
    copies
        .patch(
            name,
            &PatchParams {
                field_manager: Some(labels::HUB_FIELD_MANAGER.into()),
                ..Default::default()
            },
            &Patch::Merge(&patch),
        )
        .await
        .unwrap();
}

#[tokio::test]
async fn a_copy_edited_forged_or_replayed_on_the_hub_is_never_deployed() {
    let (ws, _hub) = workspace("signed-edit", 2).await;
    let _east = ws.agent("east", &downstream_name(1)).await;
    ws.source_secret("db-creds", &[("password", "one")]).await;
    ws.source_config_map("app-config", &[("mode", "blue")])
        .await;
    let target = unique_name("signed");
    ws.bundle("app", app_bundle(&["east"], &target)).await;
    ws.ready("east", "app").await;
    let down = ws.downstream(&downstream_name(1)).await;
    let downstream: Api<Secret> = Api::namespaced(down.clone(), &target);
    let password = || async {
        downstream
            .get("db-creds")
            .await
            .ok()
            .and_then(|s| secret_value(&s, "password"))
    };
    let cluster_ns = ws.cluster_ns("east");
    let copies: Api<Secret> = Api::namespaced(ws.hub.clone(), &cluster_ns);
    let copy = names::copy_name("app", "Secret", "db-creds");
    let bds = ws.bds("east");

    // 1. Data edited, the hub's signature and hash annotations kept.
    let evil = ByteString(b"evil".to_vec());
    edit_as_hub(&copies, &copy, json!({"data": {"password": evil}})).await;
    let why = eventually(
        "the BundleDeployment to report the refusal",
        WAIT,
        || async { Ok::<_, kube::Error>(copy_refusal(&bds).await) },
    )
    .await;
    assert_eq!(why, reason::COPY_SIGNATURE_INVALID);
    stays(
        "the downstream copy while the hub copy is edited",
        Duration::from_secs(5),
        &Some("one".to_string()),
        password,
    )
    .await;

    // 2. A signature forged with another key over the edited content: the hub, seeing a
    // signature not its own, restores the copy; downstream never changes.
    let attacker = tender_types::signing::HubKey::from_pkcs8(
        ring::signature::Ed25519KeyPair::generate_pkcs8(&ring::rand::SystemRandom::new())
            .unwrap()
            .as_ref(),
    )
    .unwrap();
    let edited = copies.get(&copy).await.unwrap();
    let content_hash = tender_types::hash::secret_hash(&edited);
    let forged = attacker.sign(&tender_types::signing::CopyClaim {
        cluster_namespace: &cluster_ns,
        bundle_deployment: "app",
        api_version: "v1",
        kind: "Secret",
        name: "db-creds",
        copy_name: &copy,
        content_hash: &content_hash,
        signed_at: u64::MAX / 2,
    });
    edit_as_hub(
        &copies,
        &copy,
        json!({"metadata": {"annotations": {labels::HUB_SIGNATURE: forged, labels::CONTENT_HASH: content_hash}}}),
    )
    .await;
    stays(
        "the downstream copy while the hub copy is forged",
        Duration::from_secs(5),
        &Some("one".to_string()),
        password,
    )
    .await;
    let restored = copies.get(&copy).await.unwrap();
    assert_eq!(
        secret_value(&restored, "password").as_deref(),
        Some("one"),
        "the hub restored its copy"
    );

    // 3. The next genuine rotation deploys.
    ws.source_secret("db-creds", &[("password", "two")]).await;
    wait_secret(&down, &target, "db-creds", "the genuine rotation", |s| {
        secret_value(s, "password").as_deref() == Some("two")
    })
    .await;
    eventually("the refusal cleared", WAIT, || async {
        Ok::<_, kube::Error>(copy_refusal(&bds).await.is_none().then_some(()))
    })
    .await;
    let signed_two = copies.get(&copy).await.unwrap();

    // 4. An older signed copy replayed after a newer one was deployed.
    ws.source_secret("db-creds", &[("password", "three")]).await;
    wait_secret(&down, &target, "db-creds", "the next rotation", |s| {
        secret_value(s, "password").as_deref() == Some("three")
    })
    .await;
    let annotations = signed_two.metadata.annotations.clone().unwrap_or_default();
    edit_as_hub(
        &copies,
        &copy,
        json!({
            "data": signed_two.data,
            "metadata": {"annotations": {
                labels::HUB_SIGNATURE: annotations[labels::HUB_SIGNATURE],
                labels::CONTENT_HASH: annotations[labels::CONTENT_HASH],
            }},
        }),
    )
    .await;
    stays(
        "the downstream copy while an older signed copy is replayed",
        Duration::from_secs(5),
        &Some("three".to_string()),
        password,
    )
    .await;
    eprintln!(
        "[{}] edited, forged and replayed copies refused; genuine rotations deployed",
        ws.ns
    );
}

#[tokio::test]
async fn a_rotation_writes_one_copy_per_cluster_and_no_bundle_deployment() {
    let (ws, hub) = workspace("signed-writes", 2).await;
    let _east = ws.agent("east", &downstream_name(1)).await;
    let _west = ws.agent("west", &downstream_name(2)).await;
    ws.source_secret("db-creds", &[("password", "one")]).await;
    ws.source_config_map("app-config", &[("mode", "blue")])
        .await;
    let target = unique_name("writes");
    ws.bundle("app", app_bundle(&["east", "west"], &target))
        .await;
    let before_east = ws.ready("east", "app").await;
    ws.ready("west", "app").await;
    let writes = |resource: &'static str| {
        let m = hub.metrics.clone();
        async move {
            ["patch", "create", "update"]
                .iter()
                .map(|v| m.kube_requests(v, resource, ""))
                .sum::<u64>()
        }
    };
    let secrets_before = settled("the hub's Secret writes", Duration::from_secs(3), || {
        writes("secrets")
    })
    .await;
    let bds_before = writes("bundledeployments").await;

    ws.source_secret("db-creds", &[("password", "two")]).await;
    for d in [1, 2] {
        let down = ws.downstream(&downstream_name(d)).await;
        wait_secret(&down, &target, "db-creds", "the rotation downstream", |s| {
            secret_value(s, "password").as_deref() == Some("two")
        })
        .await;
    }
    let secrets_after = settled("the hub's Secret writes", Duration::from_secs(3), || {
        writes("secrets")
    })
    .await;
    let bds_after = writes("bundledeployments").await;
    assert_eq!(
        secrets_after - secrets_before,
        2,
        "one copy write per cluster (2 clusters x 1 changed source)"
    );
    assert_eq!(bds_after, bds_before, "no BundleDeployment write");
    let after_east = ws.bds("east").get("app").await.unwrap();
    assert_eq!(after_east.spec, before_east.spec);
    assert_eq!(
        after_east.metadata.generation, before_east.metadata.generation,
        "the BundleDeployment's spec was not rewritten"
    );
    // The hub's summary follows the rotation: applied again with the new copy.
    eventually("the rotation reported applied", WAIT, || async {
        let bd = ws.bds("east").get("app").await?;
        let s = bd.status.clone().unwrap_or_default();
        let moved = s.applied_copies_id.is_some()
            && s.applied_copies_id
                != before_east
                    .status
                    .as_ref()
                    .and_then(|b| b.applied_copies_id.clone());
        Ok::<_, kube::Error>(moved.then_some(()))
    })
    .await;
    eprintln!(
        "[{}] rotation: {} copy writes, {} BundleDeployment writes",
        ws.ns,
        secrets_after - secrets_before,
        bds_after - bds_before
    );
}

/// Asks the hub for roll step `step` on its key Secret and waits until it is carried out.
async fn roll(ws: &Workspace, step: &str) -> String {
    let api: Api<Secret> = Api::namespaced(ws.hub.clone(), &ws.ns);
    let name = names::HUB_SIGNING_KEY_SECRET;
    api.patch(
        name,
        &PatchParams::default(),
        &Patch::Merge(&json!({"metadata": {"annotations": {tender_hub::signing::ROLL: step}}})),
    )
    .await
    .unwrap();
    eventually(&format!("roll step {step} carried out"), WAIT, || async {
        let s = api.get(name).await?;
        let done = s
            .metadata
            .annotations
            .unwrap_or_default()
            .get(tender_hub::signing::ROLLED)
            .cloned();
        Ok::<_, kube::Error>(done.filter(|d| d.starts_with(&format!("{step}/"))))
    })
    .await
}

#[tokio::test]
async fn a_key_rollover_loses_no_rotation_and_an_agent_registered_with_the_old_key_follows() {
    let (ws, _hub) = workspace("signed-roll", 2).await;
    // Registered with the first key only (the agent is not told about later keys).
    let _east = ws.agent("east", &downstream_name(1)).await;
    ws.source_secret("db-creds", &[("password", "v0")]).await;
    ws.source_config_map("app-config", &[("mode", "blue")])
        .await;
    let target = unique_name("roll");
    ws.bundle("app", app_bundle(&["east"], &target)).await;
    ws.ready("east", "app").await;
    let down = ws.downstream(&downstream_name(1)).await;
    let cluster_ns = ws.cluster_ns("east");
    let copies: Api<Secret> = Api::namespaced(ws.hub.clone(), &cluster_ns);
    let copy = names::copy_name("app", "Secret", "db-creds");
    let key_of = || async {
        let s = copies.get(&copy).await.unwrap();
        let sig = s.metadata.annotations.unwrap_or_default()[labels::HUB_SIGNATURE].clone();
        tender_types::signing::key_id_of(&sig).unwrap().to_string()
    };
    let first_key = key_of().await;
    let mut n = 0;
    let mut rotate = async || {
        n += 1;
        let value = format!("v{n}");
        ws.source_secret("db-creds", &[("password", &value)]).await;
        wait_secret(
            &down,
            &target,
            "db-creds",
            &format!("rotation {value}"),
            |s| secret_value(s, "password").as_deref() == Some(value.as_str()),
        )
        .await;
    };
    rotate().await;
    // Publish: the chain appears in the cluster namespace; the old key still signs.
    roll(&ws, "publish").await;
    let chains: Api<ConfigMap> = Api::namespaced(ws.hub.clone(), &cluster_ns);
    eventually("the key chain published", WAIT, || async {
        chains.get_opt(names::HUB_KEYS_CONFIG_MAP).await
    })
    .await;
    rotate().await;
    assert_eq!(key_of().await, first_key, "a published key is not used yet");
    // Switch: the new key signs; the agent follows through the chain.
    let switched = roll(&ws, "switch").await;
    let new_key = switched.split('/').nth(1).unwrap().to_string();
    assert_ne!(new_key, first_key);
    rotate().await;
    assert_eq!(
        key_of().await,
        new_key,
        "the rotation after the switch is signed by the new key"
    );
    rotate().await;
    // Retire: the old key's private half is dropped, copies it signed are signed anew.
    roll(&ws, "retire").await;
    rotate().await;
    rotate().await;
    assert_eq!(key_of().await, new_key);
    eprintln!(
        "[{}] key roll {first_key} -> {new_key}: {n} rotations, each deployed",
        ws.ns
    );
}
