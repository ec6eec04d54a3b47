//! Namespace fan-out on a real downstream cluster: one Secret to every namespace a
//! `targetNamespaceSelector` matches (50 of them), a namespace created later gets it, a
//! relabelled one loses it, and a rotation reaches all of them.

use std::time::Instant;

use k8s_openapi::api::core::v1::{Namespace, Secret};
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;
use tender_e2e::fixture::{Workspace, secret_value};
use tender_e2e::{downstream_name, eventually, shared_env, unique_name};

const WAIT: std::time::Duration = tender_e2e::fixture::WAIT;
const NAMESPACES: usize = 50;

async fn labelled_namespace(down: &kube::Client, name: &str, label: &str, value: Option<&str>) {
    let api: Api<Namespace> = Api::all(down.clone());
    api.patch(
        name,
        &PatchParams::apply("e2e").force(),
        &Patch::Apply(json!({
            "apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": name, "labels": {label: value}}
        })),
    )
    .await
    .unwrap();
}

async fn count_with(down: &kube::Client, namespaces: &[String], value: &str) -> usize {
    let mut n = 0;
    for ns in namespaces {
        let api: Api<Secret> = Api::namespaced(down.clone(), ns);
        if let Ok(Some(s)) = api.get_opt("shared-creds").await
            && secret_value(&s, "token").as_deref() == Some(value)
        {
            n += 1;
        }
    }
    n
}

#[tokio::test]
async fn one_secret_to_every_matching_namespace_follows_namespaces_and_rotations() {
    let ws = Workspace::new(shared_env(2).await, "fanout").await;
    let east = ws.agent("east", &downstream_name(1)).await;
    let down = ws.downstream(&east.downstream).await;
    let label = "tender-e2e/fanout";
    let id = unique_name("f");
    let namespaces: Vec<String> = (0..NAMESPACES).map(|i| format!("{id}-{i}")).collect();
    for ns in &namespaces {
        labelled_namespace(&down, ns, label, Some(&id)).await;
    }
    ws.source_secret("shared-creds", &[("token", "one")]).await;
    let started = Instant::now();
    ws.bundle(
        "fan",
        json!({
            "targets": [{"clusterName": "east"}],
            "targetNamespaceSelector": {"matchLabels": {label: id}},
            "downstreamResources": [{"kind": "Secret", "name": "shared-creds"}]
        }),
    )
    .await;
    ws.ready("east", "fan").await;
    eventually("the Secret in all 50 namespaces", WAIT, || async {
        Ok::<_, kube::Error>(
            (count_with(&down, &namespaces, "one").await == NAMESPACES).then_some(()),
        )
    })
    .await;
    eprintln!(
        "fan-out to {NAMESPACES} namespaces in {:?}",
        started.elapsed()
    );
    let bd = ws.bds("east").get("fan").await.unwrap();
    let reported = bd
        .status
        .unwrap()
        .resources
        .iter()
        .filter(|r| r.kind == "Secret")
        .count();
    assert_eq!(reported, NAMESPACES, "status lists one copy per namespace");

    // A namespace created later, matching: the copy arrives within seconds.
    let late = format!("{id}-late");
    let t = Instant::now();
    labelled_namespace(&down, &late, label, Some(&id)).await;
    eventually("the Secret in the new namespace", WAIT, || async {
        Ok::<_, kube::Error>(
            (count_with(&down, std::slice::from_ref(&late), "one").await == 1).then_some(()),
        )
    })
    .await;
    eprintln!("new namespace served in {:?}", t.elapsed());

    // Relabelled so it no longer matches: the copy goes.
    let gone = namespaces[0].clone();
    labelled_namespace(&down, &gone, label, None).await;
    let api: Api<Secret> = Api::namespaced(down.clone(), &gone);
    eventually(
        "the Secret removed from the relabelled namespace",
        WAIT,
        || async {
            Ok::<_, kube::Error>(api.get_opt("shared-creds").await?.is_none().then_some(()))
        },
    )
    .await;

    // A rotation reaches every matching namespace.
    let t = Instant::now();
    ws.source_secret("shared-creds", &[("token", "two")]).await;
    let mut matching: Vec<String> = namespaces[1..].to_vec();
    matching.push(late);
    eventually("the rotation in every matching namespace", WAIT, || async {
        Ok::<_, kube::Error>(
            (count_with(&down, &matching, "two").await == matching.len()).then_some(()),
        )
    })
    .await;
    eprintln!(
        "rotation reached {} namespaces in {:?}",
        matching.len(),
        t.elapsed()
    );
    assert!(
        api.get_opt("shared-creds").await.unwrap().is_none(),
        "not back in the relabelled one"
    );

    let ns_api: Api<Namespace> = Api::all(down.clone());
    for ns in namespaces.iter().chain([&format!("{id}-late")]) {
        ns_api.delete(ns, &Default::default()).await.ok();
    }
}
