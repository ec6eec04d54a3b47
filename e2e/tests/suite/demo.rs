//! The README's first command works: `tender-demo` runs the whole story on real clusters.

use std::process::Command;

#[test]
fn demo_copies_deploys_rotates_and_deploys_a_helm_chart() {
    // Port 0: the demo binds a free port for each metrics server before anything starts.
    let out = Command::new(env!("CARGO_BIN_EXE_tender-demo"))
        .args(["--metrics-port", "0"])
        .output()
        .expect("running tender-demo");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "tender-demo failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        stdout.matches("copies before manifests: yes").count(),
        2,
        "{stdout}"
    );
    for cluster in ["east", "west"] {
        assert!(
            stdout.contains(&format!("rotation arrived at {cluster}")),
            "{stdout}"
        );
    }
    // The Helm step: values from the copied Secret rendered on both clusters, then rotated.
    for cluster in ["east", "west"] {
        assert!(
            stdout.contains(&format!("helm values arrived at {cluster}"))
                && stdout.contains(&format!("helm rotation arrived at {cluster}")),
            "{stdout}"
        );
    }
    assert!(stdout.contains(r#"greeting="hello again""#), "{stdout}");
    // `tender status`: the HelmOp's row shows its chart and both clusters ready.
    assert!(
        stdout.lines().any(|l| {
            let cols: Vec<&str> = l.split_whitespace().collect();
            cols.first() == Some(&"web")
                && cols.contains(&"app")
                && cols.contains(&"0.1.0")
                && cols.contains(&"2/2")
                && cols.contains(&"True")
        }),
        "{stdout}"
    );
    // `tender status`: each Cluster's row counts its BundleDeployments as they are — both
    // Bundles ready — not the summary the hub writes after a delay (issue 22: it said 0/0).
    for cluster in ["east", "west"] {
        assert!(
            stdout.lines().any(|l| {
                let cols: Vec<&str> = l.split_whitespace().collect();
                cols.first() == Some(&cluster) && cols.contains(&"2/2")
            }),
            "{stdout}"
        );
    }
    // `tender status`: the Bundle's row shows both clusters ready.
    assert!(
        stdout.lines().any(|l| {
            let cols: Vec<&str> = l.split_whitespace().collect();
            cols.first() == Some(&"registry-creds")
                && cols.contains(&"2/2")
                && cols.contains(&"True")
        }),
        "{stdout}"
    );
}
