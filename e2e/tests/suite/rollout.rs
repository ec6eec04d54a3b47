//! Rollouts in waves end to end (docs/rollouts.md): 12 Clusters with their agents over two
//! downstream apiservers (each cluster deploys into its own namespace), in 3 partitions.
//!
//! The test plays the Deployment controller: the Bundle's Deployment mounts the copied Secret
//! `db-creds`, and the player makes it available only while the copy in its namespace holds an
//! accepted password. A watch on every downstream copy records each content each cluster
//! ever held, so "waves 2–3 never held the bad credential" is checked over the whole run.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::watcher::{self, Event};
use serde_json::{Value, json};
use tender_e2e::fixture::{Agent, WAIT, Workspace, secret_value, stays};
use tender_e2e::{downstream_name, eventually, shared_env, unique_name};
use tender_types::conditions::{
    TYPE_READY, TYPE_ROLLED_BACK, TYPE_ROLLOUT_HALTED, find_condition, is_true, reason,
};
use tender_types::{Bundle, BundleDeployment};

const CLUSTERS: usize = 12;
const SOAK: u64 = 4;
/// The bad rotation's deadline; also the first install's, which must finish within it while
/// the rest of the suite runs side by side (and, on a fresh machine, the nested build of the
/// binaries: 15 s was not always enough then).
const DEADLINE: u64 = 25;
/// The good rotation's deadline: generous, a slow machine must not fail it.
const GOOD_DEADLINE: u64 = 20;

/// What the test saw: per cluster, each password its copy held, with when.
#[derive(Default)]
struct Seen {
    passwords: BTreeMap<String, Vec<(String, Instant)>>,
}

struct Fleet {
    ws: Workspace,
    _agents: Vec<Agent>,
    /// Cluster → (wave 1..=3, downstream index, namespace).
    clusters: Vec<(String, usize, usize, String)>,
    seen: Arc<Mutex<Seen>>,
    /// Passwords the consumers accept.
    accepted: Arc<Mutex<BTreeSet<String>>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for Fleet {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

fn wave_of(i: usize) -> usize {
    1 + i % 3
}

impl Fleet {
    async fn start(prefix: &str) -> Self {
        // The hub keeps its rollout state in a namespace of its own, as an installed hub does.
        let ws = Workspace::with_own_hub_namespace(shared_env(2).await, prefix).await;
        let mut agents = Vec::new();
        let mut clusters = Vec::new();
        for i in 0..CLUSTERS {
            let name = format!("c{:02}", i + 1);
            let wave = wave_of(i);
            let down = 1 + i % 2;
            let w = wave.to_string();
            agents.push(
                ws.agent_labelled(&name, &downstream_name(down), &[("wave", &w)])
                    .await,
            );
            clusters.push((name.clone(), wave, down, unique_name(&name)));
        }
        let mut fleet = Fleet {
            ws,
            _agents: agents,
            clusters,
            seen: Arc::default(),
            accepted: Arc::new(Mutex::new(BTreeSet::from(["good-1".to_string()]))),
            tasks: Vec::new(),
        };
        for down in [1, 2] {
            let client = fleet.ws.downstream(&downstream_name(down)).await;
            fleet.watch_copies(client.clone(), down);
            fleet.play_deployments(client, down);
        }
        fleet
    }

    fn cluster_of_ns(&self) -> BTreeMap<String, String> {
        self.clusters
            .iter()
            .map(|(c, _, _, ns)| (ns.clone(), c.clone()))
            .collect()
    }

    /// Records every content of every copy of `db-creds` on downstream `down`.
    fn watch_copies(&mut self, client: kube::Client, down: usize) {
        let by_ns = self.cluster_of_ns();
        let seen = self.seen.clone();
        let _ = down;
        self.tasks.push(tokio::spawn(async move {
            let api: Api<Secret> = Api::all(client);
            let config = watcher::Config::default().fields("metadata.name=db-creds");
            let mut stream = watcher::watcher(api, config).boxed();
            while let Some(event) = stream.next().await {
                let objects = match event {
                    Ok(Event::Apply(s) | Event::InitApply(s)) => vec![s],
                    _ => continue,
                };
                for s in objects {
                    let ns = s.metadata.namespace.clone().unwrap_or_default();
                    let Some(cluster) = by_ns.get(&ns) else {
                        continue;
                    };
                    let password = secret_value(&s, "password").unwrap_or_default();
                    let mut seen = seen.lock().unwrap();
                    let list = seen.passwords.entry(cluster.clone()).or_default();
                    if list.last().map(|(p, _)| p) != Some(&password) {
                        list.push((password, Instant::now()));
                    }
                }
            }
        }));
    }

    /// Plays the Deployment controller on downstream `down`: `app` is available only while
    /// the copy in its namespace holds an accepted password.
    fn play_deployments(&mut self, client: kube::Client, down: usize) {
        let namespaces: Vec<String> = self
            .clusters
            .iter()
            .filter(|(_, _, d, _)| *d == down)
            .map(|(_, _, _, ns)| ns.clone())
            .collect();
        let accepted = self.accepted.clone();
        self.tasks.push(tokio::spawn(async move {
            loop {
                for ns in &namespaces {
                    if let Err(e) = play_one(&client, ns, &accepted).await {
                        eprintln!("player {ns}: {e}");
                    }
                }
                tokio::time::sleep(Duration::from_millis(150)).await;
            }
        }));
    }

    fn accept(&self, passwords: &[&str]) {
        *self.accepted.lock().unwrap() = passwords.iter().map(|p| p.to_string()).collect();
    }

    fn bundle_spec(&self, on_failure: &str, deadline: u64, with_strategy: bool) -> Value {
        let targets: Vec<Value> = self
            .clusters
            .iter()
            .map(|(c, _, _, ns)| json!({"clusterName": c, "targetNamespace": ns}))
            .collect();
        let wave = |w: &str| json!({"name": format!("wave-{w}"), "clusterSelector": {"matchLabels": {"wave": w}}});
        let mut spec = json!({
            "targets": targets,
            "downstreamResources": [{"kind": "Secret", "name": "db-creds"}],
            "resources": [{
                "apiVersion": "apps/v1", "kind": "Deployment",
                "metadata": {"name": "app"},
                "spec": {
                    "replicas": 1,
                    "selector": {"matchLabels": {"app": "app"}},
                    "template": {
                        "metadata": {"labels": {"app": "app"}},
                        "spec": {
                            "containers": [{"name": "app", "image": "example.test/app:1",
                                "volumeMounts": [{"name": "creds", "mountPath": "/creds"}]}],
                            "volumes": [{"name": "creds", "secret": {"secretName": "db-creds"}}]
                        }
                    }
                }
            }],
        });
        if with_strategy {
            spec["rolloutStrategy"] = json!({
                "partitions": [wave("1"), wave("2"), wave("3")],
                "progressDeadlineSeconds": deadline,
                "soakSeconds": SOAK,
                "onFailure": on_failure,
            });
        }
        spec
    }

    fn clusters_in(&self, waves: &[usize]) -> Vec<String> {
        self.clusters
            .iter()
            .filter(|(_, w, _, _)| waves.contains(w))
            .map(|(c, _, _, _)| c.clone())
            .collect()
    }

    /// Every cluster ever held `password`.
    fn held(&self, password: &str) -> BTreeSet<String> {
        let seen = self.seen.lock().unwrap();
        seen.passwords
            .iter()
            .filter(|(_, list)| list.iter().any(|(p, _)| p == password))
            .map(|(c, _)| c.clone())
            .collect()
    }

    /// When each cluster first held `password`.
    fn first_held(&self, password: &str) -> BTreeMap<String, Instant> {
        let seen = self.seen.lock().unwrap();
        seen.passwords
            .iter()
            .filter_map(|(c, list)| {
                list.iter()
                    .find(|(p, _)| p == password)
                    .map(|(_, t)| (c.clone(), *t))
            })
            .collect()
    }

    /// The password each cluster's copy holds now (from the watch).
    fn current(&self, cluster: &str) -> Option<String> {
        let seen = self.seen.lock().unwrap();
        seen.passwords
            .get(cluster)
            .and_then(|l| l.last())
            .map(|(p, _)| p.clone())
    }

    async fn all_ready(&self, clusters: &[String]) {
        for c in clusters {
            self.ws.ready(c, "app").await;
        }
    }

    async fn bundle(&self) -> Bundle {
        Api::<Bundle>::namespaced(self.ws.hub.clone(), &self.ws.ns)
            .get("app")
            .await
            .unwrap()
    }

    /// Waits for condition `type_` with `reason` (RolloutComplete is RolloutProgressing=False,
    /// every other reason waited for here comes with True).
    async fn wait_condition(&self, type_: &str, reason: &str) -> Bundle {
        let api = Api::<Bundle>::namespaced(self.ws.hub.clone(), &self.ws.ns);
        let want = if reason == reason::ROLLOUT_COMPLETE {
            "False"
        } else {
            "True"
        };
        eventually(
            &format!("Bundle {type_}={want} ({reason})"),
            WAIT,
            || async {
                let b = api.get("app").await?;
                let hit = b
                    .status
                    .as_ref()
                    .and_then(|s| find_condition(&s.conditions, type_))
                    .is_some_and(|c| c.status == want && c.reason == reason);
                if !hit && let Some(st) = &b.status {
                    let conds: Vec<String> = st
                        .conditions
                        .iter()
                        .map(|c| format!("{}={}({}): {}", c.type_, c.status, c.reason, c.message))
                        .collect();
                    eprintln!(
                        "rollout status: partitions {:?} conditions {conds:?}",
                        st.partitions
                    );
                }
                Ok::<_, kube::Error>(hit.then_some(b))
            },
        )
        .await
    }
}

async fn play_one(
    client: &kube::Client,
    ns: &str,
    accepted: &Mutex<BTreeSet<String>>,
) -> kube::Result<()> {
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), ns);
    let Some(d) = deployments.get_opt("app").await? else {
        return Ok(());
    };
    let secret = Api::<Secret>::namespaced(client.clone(), ns)
        .get_opt("db-creds")
        .await?;
    let password = secret.and_then(|s| secret_value(&s, "password"));
    let ok = password.is_some_and(|p| accepted.lock().unwrap().contains(&p));
    let generation = d.metadata.generation.unwrap_or(1);
    let n = i32::from(ok);
    let status = d.status.unwrap_or_default();
    if status.observed_generation == Some(generation) && status.available_replicas.unwrap_or(0) == n
    {
        return Ok(());
    }
    let body = json!({"status": {
        "observedGeneration": generation, "replicas": 1, "updatedReplicas": 1,
        "readyReplicas": n, "availableReplicas": n, "unavailableReplicas": 1 - n,
        "conditions": [{"type": "Available", "status": if ok {"True"} else {"False"},
            "reason": if ok {"MinimumReplicasAvailable"} else {"MinimumReplicasUnavailable"},
            "message": "played by the rollout test"}]
    }});
    deployments
        .patch_status("app", &PatchParams::default(), &Patch::Merge(&body))
        .await?;
    Ok(())
}

async fn rotate(fleet: &Fleet, password: &str) {
    fleet
        .ws
        .source_secret("db-creds", &[("password", password)])
        .await;
}

async fn resume(fleet: &Fleet, value: &str) {
    Api::<Bundle>::namespaced(fleet.ws.hub.clone(), &fleet.ws.ns)
        .patch(
            "app",
            &PatchParams::default(),
            &Patch::Merge(tender_cli::rollout::resume_patch(value)),
        )
        .await
        .unwrap();
}

fn phases(b: &Bundle) -> Vec<String> {
    b.status
        .as_ref()
        .map(|s| s.partitions.iter().map(|p| p.phase.clone()).collect())
        .unwrap_or_default()
}

/// The name the rollout Secret had in the workspace before decision 0112, where a hub read it.
const LEGACY_ROLLOUT_SECRET: &str = "tender-rollout-app";

/// A client for `alice`, whose only right is to read and write Secrets in the workspace
/// (docs/security.md: a hub user who can edit a source Secret).
async fn secret_editor(fleet: &Fleet) -> kube::Client {
    let role = json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
        "metadata": {"name": "secret-editor"},
        "rules": [{"apiGroups": [""], "resources": ["secrets"],
                   "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"]}]
    });
    let binding = json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": "secret-editor"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "secret-editor"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "alice"}]
    });
    let pp = PatchParams::apply("e2e").force();
    Api::<k8s_openapi::api::rbac::v1::Role>::namespaced(fleet.ws.hub.clone(), &fleet.ws.ns)
        .patch("secret-editor", &pp, &Patch::Apply(&role))
        .await
        .unwrap();
    Api::<k8s_openapi::api::rbac::v1::RoleBinding>::namespaced(fleet.ws.hub.clone(), &fleet.ws.ns)
        .patch("secret-editor", &pp, &Patch::Apply(&binding))
        .await
        .unwrap();
    let alice = fleet
        .ws
        .env
        .client_as(tender_e2e::HUB, "alice")
        .await
        .unwrap();
    let mine: Api<Secret> = Api::namespaced(alice.clone(), &fleet.ws.ns);
    eventually("alice can list the workspace's Secrets", WAIT, || async {
        Ok::<_, String>(mine.list(&Default::default()).await.ok().map(|_| ()))
    })
    .await;
    alice
}

/// The rollout state as the attacker best knows it: the Secret in the workspace where a hub
/// before decision 0112 kept it, else (the attacker told by an insider) the hub's own.
async fn rollout_state_as_known(fleet: &Fleet, alice: &kube::Client) -> Secret {
    let mine: Api<Secret> = Api::namespaced(alice.clone(), &fleet.ws.ns);
    if let Some(s) = mine.get_opt(LEGACY_ROLLOUT_SECRET).await.unwrap() {
        return s;
    }
    let name = tender_types::names::rollout_secret(&fleet.ws.ns, "app", None);
    let theirs: Api<Secret> = Api::namespaced(alice.clone(), &fleet.ws.hub_ns);
    let refused = theirs.get(&name).await.unwrap_err();
    assert!(
        matches!(&refused, kube::Error::Api(s) if s.code == 403),
        "alice cannot read the hub's rollout state: {refused}"
    );
    Api::<Secret>::namespaced(fleet.ws.hub.clone(), &fleet.ws.hub_ns)
        .get(&name)
        .await
        .unwrap()
}

/// Alice writes `data` as the rollout state wherever she can: the workspace Secret a hub
/// before decision 0112 read (a write she is allowed), and the hub's own (refused).
async fn forge_rollout_state(fleet: &Fleet, alice: &kube::Client, data: Value) {
    let body = json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": LEGACY_ROLLOUT_SECRET}, "data": data});
    let pp = PatchParams::apply("alice").force();
    Api::<Secret>::namespaced(alice.clone(), &fleet.ws.ns)
        .patch(LEGACY_ROLLOUT_SECRET, &pp, &Patch::Apply(&body))
        .await
        .unwrap();
    let name = tender_types::names::rollout_secret(&fleet.ws.ns, "app", None);
    let refused = Api::<Secret>::namespaced(alice.clone(), &fleet.ws.hub_ns)
        .patch(&name, &pp, &Patch::Apply(&body))
        .await
        .unwrap_err();
    assert!(
        matches!(&refused, kube::Error::Api(s) if s.code == 403),
        "alice cannot write the hub's rollout state: {refused}"
    );
    // Touching the source wakes the hub, as the attacker did, with an annotation copies do not
    // carry: the revision stays the same.
    let touch = json!({"metadata": {"annotations": {
        "kubectl.kubernetes.io/touched-at": format!("{:?}", Instant::now())}}});
    Api::<Secret>::namespaced(alice.clone(), &fleet.ws.ns)
        .patch("db-creds", &PatchParams::default(), &Patch::Merge(&touch))
        .await
        .unwrap();
}

fn b64_json(value: &Value) -> Value {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD
        .encode(serde_json::to_vec(value).unwrap())
        .into()
}

fn decoded(secret: &Secret, key: &str) -> Value {
    let bytes = &secret.data.as_ref().unwrap()[key].0;
    serde_json::from_slice(bytes).unwrap()
}

#[tokio::test]
async fn a_bad_rotation_fails_wave_1_rolls_it_back_and_never_reaches_waves_2_and_3() {
    let fleet = Fleet::start("rollout-bad").await;
    rotate(&fleet, "good-1").await;
    fleet
        .ws
        .bundle("app", fleet.bundle_spec("Rollback", DEADLINE, true))
        .await;
    let everyone = fleet.clusters_in(&[1, 2, 3]);
    fleet.all_ready(&everyone).await;
    let complete = fleet
        .wait_condition(
            tender_types::conditions::TYPE_ROLLOUT_PROGRESSING,
            reason::ROLLOUT_COMPLETE,
        )
        .await;
    assert_eq!(phases(&complete), ["Done", "Done", "Done"]);

    // A rotation to a credential the consumers reject.
    let started = Instant::now();
    rotate(&fleet, "bad").await;
    // While wave 1 fails, a user with Secret rights only rewrites the revisions kept for the
    // rollback: a ConfigMap added to each kept spec (its deploymentID recomputed) and another
    // password in each kept copy, under the keys the hub kept them by.
    let alice = secret_editor(&fleet).await;
    for c in fleet.clusters_in(&[1]) {
        eventually(&format!("{c} holds the bad rotation"), WAIT, || async {
            Ok::<_, String>((fleet.current(&c).as_deref() == Some("bad")).then_some(()))
        })
        .await;
    }
    let known = rollout_state_as_known(&fleet, &alice).await;
    let mut previous = decoded(&known, "previous.json");
    let mut respecs = Vec::new();
    for (key, spec) in previous["specs"].as_object().unwrap().clone() {
        let mut spec: tender_types::BundleDeploymentSpec = serde_json::from_value(spec).unwrap();
        spec.resources.push(tender_types::Manifest(json!({
            "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "forged"},
            "data": {"by": "alice"}})));
        spec.deployment_id = tender_types::hash::deployment_id(&spec.resources, &spec.options);
        let new_key = tender_types::hash::spec_hash(&spec);
        respecs.push((key, new_key, serde_json::to_value(&spec).unwrap()));
    }
    for (old_key, new_key, spec) in respecs {
        previous["specs"].as_object_mut().unwrap().remove(&old_key);
        previous["specs"][&new_key] = spec;
        for cluster in previous["clusters"].as_object_mut().unwrap().values_mut() {
            if cluster["spec"] == old_key.as_str() {
                cluster["spec"] = new_key.clone().into();
            }
        }
    }
    // Each kept copy with another password, kept under the key its new content hashes to.
    let mut rekeyed = Vec::new();
    for (key, copy) in previous["copies"].as_object().unwrap().clone() {
        use base64::Engine;
        let mut copy = copy;
        copy["data"]["password"] = base64::engine::general_purpose::STANDARD
            .encode("evil")
            .into();
        let secret: Secret = serde_json::from_value(copy.clone()).unwrap();
        let (name, _) = key.rsplit_once('@').unwrap();
        let new_key = format!("{name}@{}", tender_types::hash::secret_hash(&secret));
        rekeyed.push((key, new_key, copy));
    }
    for (old_key, new_key, copy) in rekeyed {
        previous["copies"].as_object_mut().unwrap().remove(&old_key);
        previous["copies"][&new_key] = copy;
        for cluster in previous["clusters"].as_object_mut().unwrap().values_mut() {
            for k in cluster["copies"].as_array_mut().unwrap() {
                if *k == old_key.as_str() {
                    *k = new_key.clone().into();
                }
            }
        }
    }
    forge_rollout_state(
        &fleet,
        &alice,
        json!({"state.json": b64_json(&decoded(&known, "state.json")),
               "previous.json": b64_json(&previous)}),
    )
    .await;
    let halted = fleet
        .wait_condition(TYPE_ROLLED_BACK, reason::ROLLED_BACK)
        .await;
    let halted_cond = find_condition(
        &halted.status.as_ref().unwrap().conditions,
        TYPE_ROLLOUT_HALTED,
    )
    .unwrap()
    .clone();
    assert_eq!(
        (halted_cond.status.as_str(), halted_cond.reason.as_str()),
        ("True", reason::PROGRESS_DEADLINE_EXCEEDED)
    );
    assert!(
        started.elapsed() >= Duration::from_secs(DEADLINE - 1),
        "failed by its deadline, not before"
    );
    let wave1 = fleet.clusters_in(&[1]);
    let later = fleet.clusters_in(&[2, 3]);
    assert_eq!(
        fleet.held("bad"),
        wave1.iter().cloned().collect::<BTreeSet<_>>(),
        "only wave 1 ever held the bad credential"
    );
    // Wave 1 held the bad credential, and is back at the old one — the one the hub released,
    // not what alice put in the kept revisions — ready.
    for c in &wave1 {
        eventually(&format!("{c} rolled back"), WAIT, || async {
            Ok::<_, String>((fleet.current(c).as_deref() != Some("bad")).then_some(()))
        })
        .await;
        assert_eq!(
            fleet.current(c).as_deref(),
            Some("good-1"),
            "{c} rolled back to what the hub released"
        );
    }
    fleet.all_ready(&wave1).await;
    let b = fleet.bundle().await;
    assert_eq!(phases(&b), ["RolledBack", "Waiting", "Waiting"]);
    assert!(is_true(
        &b.status.as_ref().unwrap().conditions,
        TYPE_ROLLOUT_HALTED
    ));
    // The rollout stays halted: waves 2 and 3 keep the old credential.
    stays(
        "waves 2 and 3 never hold the bad credential",
        Duration::from_secs(DEADLINE + SOAK),
        &BTreeSet::new(),
        || async {
            let bad = fleet.held("bad");
            later
                .iter()
                .filter(|c| bad.contains(*c))
                .cloned()
                .collect::<BTreeSet<String>>()
        },
    )
    .await;
    assert_eq!(
        phases(&fleet.bundle().await),
        ["RolledBack", "Waiting", "Waiting"]
    );
    // The rollback deployed only what the hub released: no forged object, no forged password.
    assert_eq!(
        fleet.held("evil"),
        BTreeSet::new(),
        "a forged copy was deployed"
    );
    for (c, _, down, ns) in fleet.clusters.iter().filter(|(_, w, _, _)| *w == 1) {
        let client = fleet.ws.downstream(&downstream_name(*down)).await;
        let forged = Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(client, ns)
            .get_opt("forged")
            .await
            .unwrap();
        assert!(
            forged.is_none(),
            "{c}: the rollback deployed a forged ConfigMap"
        );
    }
    // The rollout Secret keeps the previous revision in the hub's own namespace, never in the
    // workspace nor a cluster namespace.
    let kept = Api::<Secret>::namespaced(fleet.ws.hub.clone(), &fleet.ws.hub_ns)
        .get(&tender_types::names::rollout_secret(
            &fleet.ws.ns,
            "app",
            None,
        ))
        .await
        .unwrap();
    assert!(kept.data.unwrap().contains_key("previous.json"));
}

#[tokio::test]
async fn a_good_rotation_passes_wave_by_wave_with_the_soak_and_pause_waits_for_resume() {
    let fleet = Fleet::start("rollout-good").await;
    fleet.accept(&["good-1", "good-2", "good-3"]);
    rotate(&fleet, "good-1").await;
    fleet
        .ws
        .bundle("app", fleet.bundle_spec("Pause", GOOD_DEADLINE, true))
        .await;
    fleet.all_ready(&fleet.clusters_in(&[1, 2, 3])).await;
    fleet
        .wait_condition(
            tender_types::conditions::TYPE_ROLLOUT_PROGRESSING,
            reason::ROLLOUT_COMPLETE,
        )
        .await;

    // A good rotation: wave by wave, each released no earlier than the previous ready + soak.
    let bds_ready_at = watch_ready_times(&fleet);
    rotate(&fleet, "good-2").await;
    // During wave 1's soak, a user with Secret rights only marks every wave released and
    // complete in the rollout state and touches the source: the soak check below still holds.
    let alice = secret_editor(&fleet).await;
    for c in fleet.clusters_in(&[1]) {
        eventually(&format!("{c} holds good-2"), WAIT, || async {
            Ok::<_, String>((fleet.current(&c).as_deref() == Some("good-2")).then_some(()))
        })
        .await;
    }
    let known = rollout_state_as_known(&fleet, &alice).await;
    let mut state = decoded(&known, "state.json");
    let long_ago = k8s_openapi::jiff::Timestamp::now().as_millisecond() - 3_600_000;
    for wave in state["waves"].as_array_mut().unwrap() {
        *wave = json!({"releasedAt": long_ago, "doneAt": long_ago});
    }
    state["complete"] = true.into();
    forge_rollout_state(
        &fleet,
        &alice,
        json!({"state.json": b64_json(&state),
               "previous.json": b64_json(&decoded(&known, "previous.json"))}),
    )
    .await;
    fleet.all_ready(&fleet.clusters_in(&[1, 2, 3])).await;
    fleet
        .wait_condition(
            tender_types::conditions::TYPE_ROLLOUT_PROGRESSING,
            reason::ROLLOUT_COMPLETE,
        )
        .await;
    let first = fleet.first_held("good-2");
    let ready = bds_ready_at.lock().unwrap().clone();
    for w in [1, 2] {
        let prev_ready = fleet
            .clusters_in(&[w])
            .iter()
            .map(|c| ready[c])
            .max()
            .unwrap();
        let next_first = fleet
            .clusters_in(&[w + 1])
            .iter()
            .map(|c| first[c])
            .min()
            .unwrap();
        assert!(
            next_first >= prev_ready + Duration::from_millis(SOAK * 1000 - 300),
            "wave {} released {:?} after wave {w} was ready (soak {SOAK} s)",
            w + 1,
            next_first.saturating_duration_since(prev_ready)
        );
    }

    // Pause: a bad rotation halts at wave 1 and stays halted, wave 1 keeping the new content.
    rotate(&fleet, "bad").await;
    fleet
        .wait_condition(TYPE_ROLLOUT_HALTED, reason::PROGRESS_DEADLINE_EXCEEDED)
        .await;
    let later = fleet.clusters_in(&[2, 3]);
    stays(
        "paused: waves 2 and 3 keep good-2",
        Duration::from_secs(SOAK + 2),
        &BTreeSet::new(),
        || async {
            let bad = fleet.held("bad");
            later
                .iter()
                .filter(|c| bad.contains(*c))
                .cloned()
                .collect::<BTreeSet<String>>()
        },
    )
    .await;
    for c in fleet.clusters_in(&[1]) {
        assert_eq!(
            fleet.current(&c).as_deref(),
            Some("bad"),
            "Pause leaves wave 1 as it is"
        );
    }
    assert_eq!(
        phases(&fleet.bundle().await),
        ["Failed", "Waiting", "Waiting"]
    );
    // The consumers are fixed downstream; the rollout stays halted until resumed.
    fleet.accept(&["good-1", "good-2", "bad"]);
    fleet.all_ready(&fleet.clusters_in(&[1])).await;
    stays(
        "halted until resumed",
        Duration::from_secs(SOAK + 1),
        &BTreeSet::new(),
        || async {
            let bad = fleet.held("bad");
            later
                .iter()
                .filter(|c| bad.contains(*c))
                .cloned()
                .collect::<BTreeSet<String>>()
        },
    )
    .await;
    resume(&fleet, "now").await;
    fleet.all_ready(&fleet.clusters_in(&[1, 2, 3])).await;
    for c in fleet.clusters_in(&[1, 2, 3]) {
        eventually(&format!("{c} resumed to the new content"), WAIT, || async {
            Ok::<_, String>((fleet.current(&c).as_deref() == Some("bad")).then_some(()))
        })
        .await;
    }
    fleet
        .wait_condition(
            tender_types::conditions::TYPE_ROLLOUT_PROGRESSING,
            reason::ROLLOUT_COMPLETE,
        )
        .await;

    // Without a rolloutStrategy every cluster gets a change at once, and no wave is reported.
    fleet
        .ws
        .bundle("app", fleet.bundle_spec("Pause", GOOD_DEADLINE, false))
        .await;
    let t0 = Instant::now();
    rotate(&fleet, "good-3").await;
    for c in fleet.clusters_in(&[1, 2, 3]) {
        eventually(&format!("{c} at good-3"), WAIT, || async {
            Ok::<_, String>((fleet.current(&c).as_deref() == Some("good-3")).then_some(()))
        })
        .await;
    }
    assert!(
        t0.elapsed() < Duration::from_secs(2 * SOAK),
        "no waves without a strategy: all 12 in {:?}",
        t0.elapsed()
    );
    let b = fleet.bundle().await;
    let s = b.status.unwrap();
    assert!(s.partitions.is_empty() && s.unavailable.is_none());
    assert!(find_condition(&s.conditions, TYPE_ROLLOUT_HALTED).is_none());
    assert!(find_condition(&s.conditions, TYPE_READY).is_some());
}

/// Decisions 0112 and 0121: a rollout state the hub cannot read halts the rollout
/// (`RolloutHalted=True`, `RolloutStateInvalid`) and no deployed cluster gets the new
/// revision; deleting the hub's rollout Secret — what docs/rollouts.md tells an admin to do —
/// wakes the Bundle, and the rollout starts again from a fresh state and completes.
#[tokio::test]
async fn an_unreadable_rollout_state_halts_the_rollout_until_an_admin_deletes_it() {
    let fleet = Fleet::start("rollout-invalid").await;
    fleet.accept(&["good-1", "good-2"]);
    rotate(&fleet, "good-1").await;
    // Installed without waves (the other tests prove them), then given its strategy: the
    // rollout state is made for a revision every cluster already holds.
    fleet
        .ws
        .bundle("app", fleet.bundle_spec("Pause", GOOD_DEADLINE, false))
        .await;
    let everyone = fleet.clusters_in(&[1, 2, 3]);
    fleet.all_ready(&everyone).await;
    fleet
        .ws
        .bundle("app", fleet.bundle_spec("Pause", GOOD_DEADLINE, true))
        .await;
    fleet
        .wait_condition(
            tender_types::conditions::TYPE_ROLLOUT_PROGRESSING,
            reason::ROLLOUT_COMPLETE,
        )
        .await;

    // An admin's mistake damages the hub's own rollout Secret; the next revision finds it.
    let name = tender_types::names::rollout_secret(&fleet.ws.ns, "app", None);
    let secrets = Api::<Secret>::namespaced(fleet.ws.hub.clone(), &fleet.ws.hub_ns);
    secrets
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"state.json": b64_json(&json!("not a state"))}})),
        )
        .await
        .unwrap();
    rotate(&fleet, "good-2").await;
    fleet
        .wait_condition(TYPE_ROLLOUT_HALTED, reason::ROLLOUT_STATE_INVALID)
        .await;
    assert_eq!(
        fleet.held("good-2"),
        BTreeSet::new(),
        "a cluster got good-2"
    );

    // Deleted: a fresh rollout of the current revision, wave by wave, to every cluster.
    secrets.delete(&name, &Default::default()).await.unwrap();
    for c in &everyone {
        eventually(&format!("{c} holds good-2"), WAIT, || async {
            Ok::<_, String>((fleet.current(c).as_deref() == Some("good-2")).then_some(()))
        })
        .await;
    }
    let b = fleet
        .wait_condition(
            tender_types::conditions::TYPE_ROLLOUT_PROGRESSING,
            reason::ROLLOUT_COMPLETE,
        )
        .await;
    assert!(!is_true(
        &b.status.as_ref().unwrap().conditions,
        TYPE_ROLLOUT_HALTED
    ));
}

/// When each BundleDeployment of `app` (by cluster) was first seen ready at its current
/// deploymentID and copies (a rotation changes only the copies, decision 0091).
fn watch_ready_times(fleet: &Fleet) -> Arc<Mutex<BTreeMap<String, Instant>>> {
    let times: Arc<Mutex<BTreeMap<String, Instant>>> = Arc::default();
    let out = times.clone();
    let api: Api<BundleDeployment> = Api::all(fleet.ws.hub.clone());
    let selector = format!("{}={}", tender_types::labels::BUNDLE_NAMESPACE, fleet.ws.ns);
    tokio::spawn(async move {
        let mut stream =
            watcher::watcher(api, watcher::Config::default().labels(&selector)).boxed();
        let mut ids: BTreeMap<String, (String, Option<String>)> = BTreeMap::new();
        while let Some(event) = stream.next().await {
            let Ok(Event::Apply(bd) | Event::InitApply(bd)) = event else {
                continue;
            };
            let Some(cluster) = bd
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(tender_types::labels::CLUSTER).cloned())
            else {
                continue;
            };
            let ready = bd.status.as_ref().is_some_and(|s| {
                s.applied_deployment_id.as_deref() == Some(&bd.spec.deployment_id)
                    && is_true(&s.conditions, TYPE_READY)
            });
            let at = (
                bd.spec.deployment_id.clone(),
                bd.status.as_ref().and_then(|s| s.applied_copies_id.clone()),
            );
            if ready && ids.get(&cluster) != Some(&at) {
                ids.insert(cluster.clone(), at);
                out.lock().unwrap().insert(cluster, Instant::now());
            }
        }
    });
    times
}
