//! The Bundle controller in-process: what `bundle::reconcile` writes, situation by situation.

use serde_json::json;

use super::*;

/// A Bundle copying Secret `db` to every cluster labelled `env=prod`.
fn copying_spec() -> Value {
    json!({
        "targets": [{"clusterSelector": {"matchLabels": {"env": "prod"}}}],
        "downstreamResources": [{"kind": "Secret", "name": "db"}],
    })
}

#[tokio::test(start_paused = true)]
async fn first_fan_out_writes_one_deployment_and_its_copies_per_cluster() {
    let hub = TestHub::new();
    hub.cluster("one", &[("env", "prod")]);
    hub.cluster("two", &[("env", "prod")]);
    hub.cluster("dev", &[("env", "dev")]);
    hub.secret("db", &[("password", "s3cret")]);
    hub.bundle("app", copying_spec());
    hub.take_writes();

    hub.reconcile_bundle("app").await;
    let writes = hub.take_writes();
    println!("{writes:#?}");
}
