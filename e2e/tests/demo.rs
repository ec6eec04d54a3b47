//! The README's first command works: `tender-demo` runs the whole story on real clusters.

use std::process::Command;

#[test]
fn demo_copies_deploys_rotates_and_deploys_a_helm_chart() {
    // Three consecutive free ports for the hub's and the agents' metrics servers, below the
    // ephemeral range (32768 and up on Linux), where outgoing connections never take them.
    let start = 20_000 + (std::process::id() % 4_000) as u16 * 3;
    let base = (0..1_000u16)
        .map(|k| 20_000 + (start - 20_000 + 3 * k) % 12_000)
        .find(|p| (0..3).all(|i| std::net::TcpListener::bind(("127.0.0.1", p + i)).is_ok()))
        .expect("three free ports");
    let out = Command::new(env!("CARGO_BIN_EXE_tender-demo"))
        .args(["--metrics-port", &base.to_string()])
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
