//! The tiny ablation matrix runs from the repository's script and fills every cell.

use std::process::Command;

#[test]
fn tiny_ablation_matrix_fills_every_cell() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf();
    let out = shared_kernels::testing::Scratch::new("ablation");
    let status = Command::new("bash")
        .arg(root.join("experiments/examples/ablation.sh"))
        .args(["--tiny", "--seeds", "0", "--out", out.to_str().unwrap()])
        .env("LOCKSTEP", env!("CARGO_BIN_EXE_lockstep"))
        .current_dir(&root)
        .status()
        .expect("run experiments/examples/ablation.sh");
    assert!(status.success());
    let table = std::fs::read_to_string(out.join("table.md")).unwrap();
    for kernels in ["matched", "fast"] {
        for correction in ["none", "tis", "mis", "ppo_clip"] {
            let name = format!("{kernels}-{correction}-s0");
            let row = table.lines().find(|l| l.starts_with(&format!("| {name} |"))).unwrap_or_else(|| panic!("no row for {name}:\n{table}"));
            let cells: Vec<&str> = row.split('|').map(str::trim).filter(|c| !c.is_empty()).collect();
            assert_eq!(cells.len(), 11, "{row}");
            assert!(cells.iter().all(|c| !c.is_empty() && !c.contains("NaN")), "{row}");
            assert_eq!(cells[1], "3", "three steps logged: {row}");
            if kernels == "matched" {
                // the product's promise, per cell: bits equal, KL exactly zero
                assert_eq!(cells[7], "1.0000", "{row}");
                assert_eq!(cells[4], "0.000e0", "{row}");
            }
        }
    }
    for png in ["reward.png", "kl.png", "logprob_abs_diff_max.png"] {
        let bytes = std::fs::read(out.join(png)).unwrap();
        assert_eq!(&bytes[1..4], b"PNG", "{png}");
    }
}
