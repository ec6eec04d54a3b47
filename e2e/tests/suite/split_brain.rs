//! Split brain (issue 22 item 8): a leader that loses its Lease but keeps its connection.
//!
//! Two `tender-hub` processes from the chart's Deployment compete for the Lease. The leader
//! reaches its apiserver through a [`WriteGate`] (with the chart's ServiceAccount's own
//! credentials, so RBAC is the chart's). Once it leads and works (a source Secret rotated every
//! 500 ms keeps it writing copies), the gate holds its Lease renewals — only those: every other
//! request of it flows, so nothing but the Lease tells it that it no longer leads. The standby
//! takes the Lease once it expires. The test asserts, from the gate's record of every write it
//! forwarded, that the leader made its last write (other than the held renewals) before the
//! standby's `acquireTime`, and within [`RENEW_DEADLINE`] (plus the transit of a write) of its
//! last successful renewal; and that it writes nothing afterwards while the standby does.

use std::time::{Duration, SystemTime};

use k8s_openapi::api::coordination::v1::Lease;
use kube::ResourceExt;
use kube::api::Api;
use tender_e2e::fixture::{Workspace, app_bundle, stays};
use tender_e2e::proxy::{ForwardedWrite, GatedIdentity};
use tender_e2e::running::{OwnEnv, Running, install_hub_chart};
use tender_e2e::{HUB, eventually};
use tender_runtime::leader::{LEASE_DURATION_SECONDS, RENEW_DEADLINE};

const WAIT: Duration = Duration::from_secs(120);
/// Slack for a write the leader sent just before it stepped down to cross the gate.
const TRANSIT: Duration = Duration::from_secs(2);

async fn lease(leases: &Api<Lease>) -> Option<Lease> {
    leases.get_opt("tender-hub").await.ok().flatten()
}

fn holder(lease: Option<&Lease>) -> Option<String> {
    lease?.spec.as_ref()?.holder_identity.clone()
}

fn seconds(since: SystemTime, t: SystemTime) -> f64 {
    match t.duration_since(since) {
        Ok(d) => d.as_secs_f64(),
        Err(e) => -e.duration().as_secs_f64(),
    }
}

#[tokio::test]
async fn a_leader_whose_renewals_hang_stops_writing_before_the_standby_takes_the_lease() {
    let env = OwnEnv::start(0).await;
    let ws = Workspace::without_hub(env.0, "split-brain").await;
    let deployment = install_hub_chart(&ws.hub, &ws.ns, &[]).await;
    let release_ns = deployment.namespace().unwrap();
    let gated = GatedIdentity::of_deployment(env.0, HUB, &deployment).await;
    let gate = &gated.gate;
    let (flag, kubeconfig) = gated.flag();

    let leases: Api<Lease> = Api::namespaced(ws.hub.clone(), &release_ns);
    let lease_path =
        format!("/apis/coordination.k8s.io/v1/namespaces/{release_ns}/leases/tender-hub");
    let a = Running::start(
        env.0,
        HUB,
        &deployment,
        "tender-hub-0",
        &[(flag, &kubeconfig)],
    )
    .await;
    eventually("tender-hub-0 to hold the Lease", WAIT, || async {
        let l = lease(&leases).await;
        Ok::<_, std::convert::Infallible>(
            (holder(l.as_ref()).as_deref() == Some("tender-hub-0")).then_some(()),
        )
    })
    .await;
    let b = Running::start(env.0, HUB, &deployment, "tender-hub-1", &[]).await;

    // Work for the leader: 4 clusters, one Bundle copying a Secret that changes every 500 ms.
    ws.source_secret("db-creds", &[("password", "r0")]).await;
    ws.source_config_map("app-config", &[("mode", "blue")])
        .await;
    let clusters = ["c0", "c1", "c2", "c3"];
    for c in clusters {
        ws.cluster(c).await;
    }
    ws.bundle("app", app_bundle(&clusters, "apps")).await;
    let churn = {
        let ws_hub = ws.hub.clone();
        let ns = ws.ns.clone();
        tokio::spawn(async move {
            let secrets: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(ws_hub, &ns);
            for i in 1.. {
                let patch = serde_json::json!({"stringData": {"password": format!("r{i}")}});
                let _ = secrets
                    .patch(
                        "db-creds",
                        &kube::api::PatchParams::default(),
                        &kube::api::Patch::Merge(patch),
                    )
                    .await;
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        })
    };
    let is_renewal = {
        let lease_path = lease_path.clone();
        move |w: &ForwardedWrite| w.path == lease_path
    };
    let work = |log: &[ForwardedWrite]| log.iter().filter(|w| !is_renewal(w)).count();
    eventually("the leader to write copies through the gate", WAIT, || {
        let n = work(&gate.forwarded_log());
        async move { Ok::<_, std::convert::Infallible>((n > 20).then_some(())) }
    })
    .await;
    assert_eq!(
        b.writes().await,
        0,
        "the standby wrote nothing while it stood by"
    );

    // Renewals hang from now on; everything else of the leader flows.
    let armed = SystemTime::now();
    {
        let lease_path = lease_path.clone();
        gate.hold_only(move |method, path| {
            path == lease_path && [http::Method::PATCH, http::Method::PUT].contains(method)
        });
    }
    eventually("a renewal of the leader held at the gate", WAIT, || {
        let held = !gate.holding().is_empty();
        async move { Ok::<_, std::convert::Infallible>(held.then_some(())) }
    })
    .await;
    let last_renewal = gate
        .forwarded_log()
        .iter()
        .rfind(|w| is_renewal(w))
        .map(|w| w.at)
        .expect("the leader renewed its Lease through the gate");
    eventually("tender-hub-1 to take the Lease", WAIT, || async {
        let l = lease(&leases).await;
        Ok::<_, std::convert::Infallible>(
            (holder(l.as_ref()).as_deref() == Some("tender-hub-1")).then_some(()),
        )
    })
    .await;
    let acquired: SystemTime = lease(&leases)
        .await
        .and_then(|l| l.spec?.acquire_time)
        .map(|t| t.0.into())
        .expect("the new holder's acquireTime");
    // The new leader works (its writes are the rotations' copies), and meanwhile the old one
    // had every chance to keep writing if it believed it still led.
    let b_start = b.writes().await;
    eventually("the new leader to write", WAIT, || async {
        Ok::<_, std::convert::Infallible>((b.writes().await > b_start + 8).then_some(()))
    })
    .await;
    let log = gate.forwarded_log();
    let after_arming: Vec<&ForwardedWrite> = log
        .iter()
        .filter(|w| !is_renewal(w) && w.at >= armed)
        .collect();
    let last = after_arming.last().map(|w| w.at);
    eprintln!(
        "[{}] renewals held from t=0; last renewal {:+.1} s; the leader's last write {}; \
         standby acquired {:+.1} s (lease {LEASE_DURATION_SECONDS} s, renew deadline {} s); \
         {} writes of the leader after arming",
        ws.ns,
        seconds(armed, last_renewal),
        last.map_or("none".to_string(), |l| format!(
            "{:+.1} s",
            seconds(armed, l)
        )),
        seconds(armed, acquired),
        RENEW_DEADLINE.as_secs(),
        after_arming.len(),
    );
    let last = last.expect(
        "the leader went on writing after its renewals were held (the churn keeps it busy)",
    );
    let late: Vec<String> = after_arming
        .iter()
        .filter(|w| w.at >= acquired)
        .take(5)
        .map(|w| format!("{:+.1} s {} {}", seconds(armed, w.at), w.method, w.path))
        .collect();
    assert!(
        last < acquired,
        "split brain: the old leader wrote after the standby acquired the Lease ({:+.1} s): {late:?}",
        seconds(armed, acquired)
    );
    assert!(
        last <= last_renewal + RENEW_DEADLINE + TRANSIT,
        "the old leader wrote {:.1} s after its last renewal (deadline {} s)",
        seconds(last_renewal, last),
        RENEW_DEADLINE.as_secs()
    );
    // And stays quiet while the new leader works.
    let quiet = work(&gate.forwarded_log());
    stays(
        "the old leader's writes (other than held renewals)",
        Duration::from_secs(5),
        &quiet,
        || {
            let n = work(&gate.forwarded_log());
            async move { n }
        },
    )
    .await;
    churn.abort();
    gate.discard_held();
    drop(a);
    // Neither replica (one ServiceAccount) was refused anything by the apiserver.
    env.0
        .audit(HUB)
        .assert_never_refused(&gated.user, "the hub");
}
