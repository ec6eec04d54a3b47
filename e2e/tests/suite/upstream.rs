//! Reverse sync (issue 11) end to end: downstream Secrets published on the hub through
//! placeholders only the cluster's own agent may write — with the agents' real narrow hub
//! identities on real apiservers.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;
use tender_e2e::agent_harness::start_agent_with;
use tender_e2e::fixture::{WAIT, Workspace, create_namespace, secret, secret_value, wait_secret};
use tender_e2e::hub_harness::{hub_config, start_hub};
use tender_e2e::{ADMIN_USER, client_from_yaml, downstream_name, eventually, shared_env};
use tender_types::{Bundle, BundleDeployment, Cluster, UpstreamState, labels, names};

const NS: &str = "vpc";

async fn put_request(client: &kube::Client, value: &str) {
    let mut s = secret("peering-request", &[("vpcId", value)]);
    s.metadata.labels = Some(BTreeMap::from([("team".into(), "net".into())]));
    Api::<Secret>::namespaced(client.clone(), NS)
        .patch(
            "peering-request",
            &PatchParams::apply("e2e").force(),
            &Patch::Apply(&s),
        )
        .await
        .unwrap();
}

async fn line_state(ws: &Workspace, bundle: &str, cluster: &str) -> Option<UpstreamState> {
    let b = Api::<Bundle>::namespaced(ws.hub.clone(), &ws.ns)
        .get(bundle)
        .await
        .ok()?;
    b.status?
        .upstream
        .into_iter()
        .find(|l| l.cluster == cluster)
        .map(|l| l.state)
}

async fn wait_state(ws: &Workspace, bundle: &str, cluster: &str, state: UpstreamState) {
    eventually(
        &format!("Bundle {bundle} reports {cluster} {state}"),
        WAIT,
        || async {
            Ok::<_, kube::Error>(
                (line_state(ws, bundle, cluster).await == Some(state)).then_some(()),
            )
        },
    )
    .await;
}

fn status_code<T: std::fmt::Debug>(r: Result<T, kube::Error>) -> u16 {
    match r {
        Err(kube::Error::Api(s)) => s.code,
        other => panic!("expected an API error, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn reverse_sync_publishes_isolates_goes_stale_and_cleans_up() {
    let env = shared_env(2).await;
    let ws = Workspace::without_hub(env, "upstream").await;
    let mut config = hub_config(&ws.ns);
    config.agent_offline_after = Duration::from_secs(6);
    config.upstream_max_bytes = 1024;
    let _hub = start_hub(env, config).await.unwrap();
    let (east_down, west_down) = (downstream_name(1), downstream_name(2));
    let east_client = ws.downstream(&east_down).await;
    let west_client = ws.downstream(&west_down).await;
    create_namespace(&east_client, NS).await;
    create_namespace(&west_client, NS).await;
    put_request(&east_client, "vpc-east-1").await;
    put_request(&west_client, "vpc-west-1").await;

    let (east_kc, east_cfg) = ws.register("east").await;
    let east_down_kc = env.kubeconfig_as(&east_down, ADMIN_USER);
    let east_agent = start_agent_with(&east_kc, &east_down_kc, east_cfg)
        .await
        .unwrap();
    let _west_agent = ws.agent("west", &west_down).await;

    let spec = json!({
        "targets": [{"clusterName": "east"}, {"clusterName": "west"}],
        "defaultNamespace": NS,
        "upstreamResources": [{"kind": "Secret", "name": "peering-request"}],
    });
    ws.bundle("vpc", spec.clone()).await;

    // Published under the documented name, with the source's labels and tender's.
    let published = names::upstream_name("vpc", "east", "peering-request");
    assert!(
        published.starts_with("vpc-east-peering-request-"),
        "{published}"
    );
    let s = wait_secret(
        &ws.hub,
        &ws.ns,
        &published,
        "east's request published",
        |s| secret_value(s, "vpcId").as_deref() == Some("vpc-east-1"),
    )
    .await;
    let l = s.metadata.labels.unwrap();
    assert_eq!(l["team"], "net");
    assert_eq!(l[labels::UPSTREAM], labels::UPSTREAM_PUBLISHED);
    assert_eq!(l[labels::CLUSTER], "east");
    let west_published = names::upstream_name("vpc", "west", "peering-request");
    wait_secret(
        &ws.hub,
        &ws.ns,
        &west_published,
        "west's request published",
        |s| secret_value(s, "vpcId").as_deref() == Some("vpc-west-1"),
    )
    .await;
    wait_state(&ws, "vpc", "east", UpstreamState::Published).await;
    let bd = ws.bds("east").get("vpc").await.unwrap();
    let up = bd.status.unwrap().upstream;
    assert_eq!(up.len(), 1, "{up:?}");
    assert_eq!(up[0].state, UpstreamState::Published);
    assert!(up[0].hash.is_some() && up[0].last_published.is_some());

    // Changed downstream → updated on the hub.
    put_request(&east_client, "vpc-east-2").await;
    wait_secret(
        &ws.hub,
        &ws.ns,
        &published,
        "east's change published",
        |s| secret_value(s, "vpcId").as_deref() == Some("vpc-east-2"),
    )
    .await;

    // Isolation, with the east agent's own hub identity.
    let agent = client_from_yaml(&east_kc).await.unwrap();
    let east_ns = ws.cluster_ns("east");
    let west_ns = ws.cluster_ns("west");
    let placeholder = names::upstream_placeholder("vpc", "Secret", NS, "peering-request");
    let own: Api<Secret> = Api::namespaced(agent.clone(), &east_ns);
    own.get(&placeholder)
        .await
        .expect("an agent reads its own placeholder");
    let patch = Patch::Merge(json!({"data": {"x": "eA=="}}));
    let pp = PatchParams::default();
    let other: Api<Secret> = Api::namespaced(agent.clone(), &west_ns);
    assert_eq!(
        status_code(other.patch(&placeholder, &pp, &patch).await),
        403,
        "west's placeholder"
    );
    assert_eq!(
        status_code(
            own.create(&PostParams::default(), &secret("made-up", &[("a", "b")]))
                .await
        ),
        403,
        "creating in its own cluster namespace"
    );
    let copy_name = names::copy_name("vpc", "Secret", "x");
    assert_eq!(
        status_code(own.patch(&copy_name, &pp, &patch).await),
        403,
        "another name"
    );
    let workspace: Api<Secret> = Api::namespaced(agent.clone(), &ws.ns);
    assert_eq!(
        status_code(workspace.patch(&published, &pp, &patch).await),
        403,
        "the published object itself"
    );

    // Too large: rejected, the last valid publication stays.
    put_request(&east_client, &"x".repeat(2000)).await;
    wait_state(&ws, "vpc", "east", UpstreamState::Rejected).await;
    let s = Api::<Secret>::namespaced(ws.hub.clone(), &ws.ns)
        .get(&published)
        .await
        .unwrap();
    assert_eq!(secret_value(&s, "vpcId").as_deref(), Some("vpc-east-2"));

    // Deleted downstream → removed on the hub and reported Missing.
    Api::<Secret>::namespaced(east_client.clone(), NS)
        .delete("peering-request", &DeleteParams::default())
        .await
        .unwrap();
    wait_state(&ws, "vpc", "east", UpstreamState::Missing).await;
    eventually("east's publication removed", WAIT, || async {
        let gone = Api::<Secret>::namespaced(ws.hub.clone(), &ws.ns)
            .get_opt(&published)
            .await?
            .is_none();
        Ok::<_, kube::Error>(gone.then_some(()))
    })
    .await;

    // Round trip: request downstream → read centrally → answer pushed back down.
    put_request(&east_client, "vpc-east-3").await;
    let request = wait_secret(&ws.hub, &ws.ns, &published, "request again", |s| {
        secret_value(s, "vpcId").as_deref() == Some("vpc-east-3")
    })
    .await;
    let answer_value = format!("pcx-for-{}", secret_value(&request, "vpcId").unwrap());
    ws.source_secret("peering-answer", &[("peeringId", &answer_value)])
        .await;
    let mut with_answer = spec.clone();
    with_answer["downstreamResources"] = json!([{"kind": "Secret", "name": "peering-answer"}]);
    ws.bundle("vpc", with_answer).await;
    wait_secret(
        &east_client,
        NS,
        "peering-answer",
        "answer downstream",
        |s| secret_value(s, "peeringId").as_deref() == Some(answer_value.as_str()),
    )
    .await;

    // Agent gone → stale since its last heartbeat, content kept.
    east_agent.kill().await;
    wait_state(&ws, "vpc", "east", UpstreamState::Stale).await;
    let b = Api::<Bundle>::namespaced(ws.hub.clone(), &ws.ns)
        .get("vpc")
        .await
        .unwrap();
    let line = b
        .status
        .unwrap()
        .upstream
        .into_iter()
        .find(|l| l.cluster == "east")
        .unwrap();
    assert!(line.stale_since.is_some(), "{line:?}");
    let s = Api::<Secret>::namespaced(ws.hub.clone(), &ws.ns)
        .get(&published)
        .await
        .unwrap();
    assert_eq!(secret_value(&s, "vpcId").as_deref(), Some("vpc-east-3"));

    // Cluster deleted → its publication goes.
    Api::<Cluster>::namespaced(ws.hub.clone(), &ws.ns)
        .delete("west", &DeleteParams::default())
        .await
        .unwrap();
    eventually(
        "west's publication removed with its Cluster",
        WAIT,
        || async {
            let gone = Api::<Secret>::namespaced(ws.hub.clone(), &ws.ns)
                .get_opt(&west_published)
                .await?
                .is_none();
            Ok::<_, kube::Error>(gone.then_some(()))
        },
    )
    .await;

    // Bundle deleted → every publication goes (owned by the Bundle).
    ws.delete_bundle("vpc").await;
    eventually("publications removed with the Bundle", WAIT, || async {
        let gone = Api::<Secret>::namespaced(ws.hub.clone(), &ws.ns)
            .get_opt(&published)
            .await?
            .is_none();
        Ok::<_, kube::Error>(gone.then_some(()))
    })
    .await;
    let _ = Api::<BundleDeployment>::namespaced(ws.hub.clone(), &east_ns);
}

/// Issue 22: cluster `east` publishing `peering-request` and cluster `east-peering` publishing
/// `request` read the same as `<bundle>-<cluster>-<name>`; both are published, apart.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn published_names_of_two_clusters_never_collide() {
    let env = shared_env(2).await;
    let ws = Workspace::new(env, "pair").await;
    let ns = tender_e2e::unique_name("pair");
    let (east_down, other_down) = (downstream_name(1), downstream_name(2));
    for (down, name, from) in [
        (&east_down, "peering-request", "east"),
        (&other_down, "request", "east-peering"),
    ] {
        let client = ws.downstream(down).await;
        create_namespace(&client, &ns).await;
        Api::<Secret>::namespaced(client, &ns)
            .create(&PostParams::default(), &secret(name, &[("from", from)]))
            .await
            .unwrap();
    }
    let _east = ws.agent("east", &east_down).await;
    let _east_peering = ws.agent("east-peering", &other_down).await;
    ws.bundle(
        "vpc",
        json!({
            "targets": [{"clusterName": "east"}, {"clusterName": "east-peering"}],
            "defaultNamespace": ns,
            "upstreamResources": [
                {"kind": "Secret", "name": "peering-request"},
                {"kind": "Secret", "name": "request"}
            ],
        }),
    )
    .await;
    for (cluster, name) in [("east", "peering-request"), ("east-peering", "request")] {
        wait_secret(
            &ws.hub,
            &ws.ns,
            &names::upstream_name("vpc", cluster, name),
            &format!("{cluster}'s {name} published"),
            |s| secret_value(s, "from").as_deref() == Some(cluster),
        )
        .await;
    }
    let bundle = Api::<Bundle>::namespaced(ws.hub.clone(), &ws.ns)
        .get("vpc")
        .await
        .unwrap();
    let lines = bundle.status.unwrap().upstream;
    assert!(
        lines.iter().all(|l| l.state != UpstreamState::Conflict),
        "{lines:?}"
    );
}
