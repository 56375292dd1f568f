//! `tlio ckpt import`: a checkpoint written by PyTorch DCP's own FileSystemWriter (made
//! here by the test environment's Python and torch) becomes a step that `ckpt verify`
//! passes; a missing source is exit 2, a damaged one exit 1, each with one error line;
//! an interpreter that cannot be run is named with the variable that chooses it.

use std::path::{Path, PathBuf};
use std::process::Command as StdCommand;

use crate::s3::python;
use crate::{tlio, tmp};

/// A FileSystemWriter checkpoint of a small state at `dir/step-3` (tensors and a dict
/// DCP stores as bytes items), written in one process.
pub(crate) fn dcp_checkpoint(dir: &Path) -> PathBuf {
    let out = dir.join("step-3");
    let code = "import sys, warnings, torch\n\
        warnings.simplefilter('ignore')\n\
        import torch.distributed.checkpoint as dcp\n\
        sd = {'w': torch.arange(12, dtype=torch.float32).reshape(3, 4), 'b': torch.ones(5, dtype=torch.bfloat16),\n\
              'extra': {'epoch': 2}}\n\
        dcp.save(sd, storage_writer=dcp.FileSystemWriter(sys.argv[1]), no_dist=True)\n";
    let status = StdCommand::new(python())
        .args(["-c", code])
        .arg(&out)
        .status()
        .expect("cannot run the test environment's Python");
    assert!(status.success(), "writing a DCP checkpoint failed");
    out
}

fn import(source: &Path, run: &Path) -> assert_cmd::Command {
    let mut cmd = tlio();
    cmd.env("TLIO_PYTHON", python())
        .args(["ckpt", "import"])
        .arg(source)
        .arg("-o")
        .arg(run);
    cmd
}

#[test]
fn a_filesystem_writer_checkpoint_imports_as_a_step_that_verifies() {
    let dir = tmp();
    let source = dcp_checkpoint(dir.path());
    let run = dir.path().join("run");
    let out = import(&source, &run).output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let step = run.join("step-000003");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        format!("{}\n", step.display())
    );
    assert!(
        out.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    tlio()
        .args(["ckpt", "verify"])
        .arg(&step)
        .assert()
        .success();
    // A second import of the same step is refused: exit 1, one line.
    let out = import(&source, &run).output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.starts_with("tlio: error: ") && err.lines().count() == 1,
        "{err}"
    );
}

#[test]
fn a_missing_or_damaged_source_is_refused_and_nothing_is_committed() {
    let dir = tmp();
    let run = dir.path().join("run");
    let out = import(&dir.path().join("nope"), &run).output().unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("nope") && err.lines().count() == 1, "{err}");
    let source = dcp_checkpoint(dir.path());
    let data = source.join("__0_0.distcp");
    let bytes = std::fs::read(&data).unwrap();
    std::fs::write(&data, &bytes[..bytes.len() - 10]).unwrap();
    let out = import(&source, &run).output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("__0_0.distcp") && err.contains("past the file"),
        "{err}"
    );
    assert!(!run.join("step-000003").exists());
}

#[test]
fn an_interpreter_that_cannot_run_is_named_with_its_variable() {
    let dir = tmp();
    let out = tlio()
        .env("TLIO_PYTHON", dir.path().join("no-python"))
        .args(["ckpt", "import"])
        .arg(dir.path())
        .arg("-o")
        .arg(dir.path().join("run"))
        .output()
        .unwrap();
    // A missing interpreter is a missing file: exit 2.
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("no-python") && err.contains("TLIO_PYTHON"),
        "{err}"
    );
}
