//! The output layer seen from outside: progress bars appear when standard error is a
//! terminal and never when it is piped, and `-q` silences them.

use std::io::Read;
use std::os::fd::{FromRawFd, OwnedFd};
use std::process::{Command, Stdio};

/// What a command printed when its standard error was a terminal.
pub struct TtyRun {
    /// The exit code.
    pub code: Option<i32>,
    /// Standard output (a pipe).
    pub stdout: Vec<u8>,
    /// Everything the terminal received on standard error.
    pub terminal: Vec<u8>,
}

/// Run `tlio ARGS` in `dir` with standard error on a fresh pseudo-terminal (80x24) and
/// standard output on a pipe, the way a user at a shell redirects results to a file.
pub fn run_with_tty_stderr(dir: &std::path::Path, args: &[&str]) -> TtyRun {
    let mut master: libc::c_int = -1;
    let mut slave: libc::c_int = -1;
    let size = libc::winsize {
        ws_row: 24,
        ws_col: 80,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: openpty writes two new descriptors into the two out-pointers, which point
    // at live locals; the name and termios pointers may be null.
    let rc = unsafe {
        libc::openpty(
            &mut master,
            &mut slave,
            std::ptr::null_mut(),
            std::ptr::null(),
            &size,
        )
    };
    assert_eq!(rc, 0, "openpty failed");
    // SAFETY: both descriptors were just opened by openpty and are owned by nobody else.
    let (master, slave) = unsafe { (OwnedFd::from_raw_fd(master), OwnedFd::from_raw_fd(slave)) };
    let mut cmd = Command::new(assert_cmd::cargo::cargo_bin("tlio"));
    cmd.args(args)
        .current_dir(dir)
        .env_remove("FAILPOINTS")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::from(slave));
    let mut child = cmd.spawn().expect("tlio starts");
    // The parent's copy of the slave end must be closed, or reading the master would
    // never see the end of the child's output.
    drop(cmd);
    let mut master = std::fs::File::from(master);
    let reader = std::thread::spawn(move || {
        let mut seen = Vec::new();
        let mut buf = [0u8; 4096];
        // Linux reports EIO on the master once every slave descriptor is closed.
        while let Ok(n) = master.read(&mut buf) {
            if n == 0 {
                break;
            }
            seen.extend_from_slice(&buf[..n]);
        }
        seen
    });
    let mut stdout = Vec::new();
    child
        .stdout
        .take()
        .expect("piped stdout")
        .read_to_end(&mut stdout)
        .unwrap();
    let status = child.wait().unwrap();
    let terminal = reader.join().unwrap();
    TtyRun {
        code: status.code(),
        stdout,
        terminal,
    }
}

#[test]
fn a_pseudo_terminal_is_a_terminal_for_tlio() {
    // `generate man` says what it wrote on stderr (chatter): on a terminal it arrives
    // there, and `-q` silences it. This checks the harness itself before the bars.
    let dir = super::tmp();
    let run = run_with_tty_stderr(dir.path(), &["generate", "man", "pages"]);
    assert_eq!(run.code, Some(0));
    assert!(String::from_utf8_lossy(&run.terminal).contains("man pages"));
    assert!(run.stdout.is_empty(), "chatter never goes to stdout");
    let run = run_with_tty_stderr(dir.path(), &["-q", "generate", "man", "pages"]);
    assert_eq!(run.code, Some(0));
    assert!(run.terminal.is_empty());
}

/// True when the bytes contain what an indicatif bar draws: a carriage return or an
/// ANSI control sequence.
fn looks_like_a_bar(bytes: &[u8]) -> bool {
    bytes.contains(&b'\r') || bytes.windows(2).any(|w| w == b"\x1b[")
}

/// A 4 MiB single-tensor F32 safetensors file, so `st convert` runs long enough to
/// draw its bar.
fn big_safetensors(dir: &std::path::Path) -> &'static str {
    const N: usize = 1 << 20;
    let mut header = format!(
        "{{\"w\":{{\"dtype\":\"F32\",\"shape\":[{N}],\"data_offsets\":[0,{}]}}}}",
        4 * N
    );
    while header.len() % 8 != 0 {
        header.push(' ');
    }
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(header.as_bytes());
    for i in 0..N {
        bytes.extend_from_slice(&(i as f32 * 0.25).to_le_bytes());
    }
    std::fs::write(dir.join("big.safetensors"), bytes).unwrap();
    "big.safetensors"
}

#[test]
fn progress_bar_on_a_terminal_not_when_piped() {
    let dir = super::tmp();
    let input = big_safetensors(dir.path());
    let convert = |out: &'static str| ["st", "convert", input, out, "--dtype", "BF16"];
    let run = run_with_tty_stderr(dir.path(), &convert("a.safetensors"));
    assert_eq!(run.code, Some(0));
    assert!(
        looks_like_a_bar(&run.terminal),
        "no bar drawn on a terminal: {:?}",
        String::from_utf8_lossy(&run.terminal)
    );
    assert!(
        !looks_like_a_bar(&run.stdout),
        "the bar never goes to stdout"
    );
    let piped = super::tlio()
        .current_dir(dir.path())
        .args(convert("b.safetensors"))
        .output()
        .unwrap();
    assert!(piped.status.success());
    assert!(
        !looks_like_a_bar(&piped.stderr),
        "a bar was drawn into a pipe: {:?}",
        String::from_utf8_lossy(&piped.stderr)
    );
    let mut quiet = vec!["-q"];
    quiet.extend(convert("c.safetensors"));
    let quiet = run_with_tty_stderr(dir.path(), &quiet);
    assert_eq!(quiet.code, Some(0));
    assert!(quiet.terminal.is_empty(), "-q silences the bar");
    let a = std::fs::read(dir.path().join("a.safetensors")).unwrap();
    assert_eq!(a, std::fs::read(dir.path().join("b.safetensors")).unwrap());
}

/// Run `tlio ARGS` from the repository root with stdout a pipe whose reader is already
/// gone, as in `tlio ... | head` once head has exited.
fn run_into_closed_pipe(args: &[&str]) -> std::process::Output {
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let mut cmd = Command::new(assert_cmd::cargo::cargo_bin("tlio"));
    cmd.args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env_remove("FAILPOINTS")
        .stdout(writer)
        .stderr(Stdio::piped());
    let child = cmd.spawn().unwrap();
    drop(cmd);
    child.wait_with_output().unwrap()
}

#[test]
fn a_closed_pipe_ends_quietly_with_0() {
    let st = "fixtures/safetensors/golden/mixed_every_dtype.safetensors";
    let shard = "fixtures/cli/tiny.bin";
    let ckpt = "fixtures/cli/ckpt";
    let cases: &[&[&str]] = &[
        &["st", "inspect", st],
        &["--json", "st", "inspect", st],
        &["--json", "st", "verify", st],
        &["tokens", "header", shard],
        &["--json", "tokens", "header", shard],
        &[
            "tokens",
            "windows",
            shard,
            "--seq-len",
            "2",
            "--batch",
            "1",
            "--batches",
            "5",
        ],
        &["ckpt", "verify", ckpt],
        &["--json", "ckpt", "verify", ckpt],
        &["ckpt", "latest", ckpt],
        &["generate", "completions", "bash"],
    ];
    for args in cases {
        let out = run_into_closed_pipe(args);
        assert_eq!(
            out.status.code(),
            Some(0),
            "tlio {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.stderr.is_empty(), "tlio {}: quiet", args.join(" "));
    }
}

#[test]
fn plain_progress_lines_only_without_json_and_quiet() {
    let dir = super::tmp();
    let shard = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/cli/tiny.bin");
    let train = |out: &str, flags: &[&str]| {
        let mut cmd = super::tlio();
        cmd.current_dir(dir.path())
            .args(flags)
            .args(["train", "bigram", "--data"]);
        cmd.arg(&shard).args([
            "--out",
            out,
            "--seq-len",
            "4",
            "--batch",
            "1",
            "--max-steps",
            "10",
            "--ckpt-every",
            "10",
            "--log-every",
            "5",
        ]);
        cmd.output().unwrap()
    };
    let plain = train("a", &[]);
    assert!(plain.status.success());
    let log = String::from_utf8_lossy(&plain.stderr);
    assert!(log.contains("step 5 ") && log.contains("step 10 "), "{log}");
    assert!(
        !looks_like_a_bar(&plain.stderr),
        "plain lines, no bar: {log}"
    );
    for flags in [&["--json"][..], &["-q"][..]] {
        let out = train(if flags[0] == "-q" { "q" } else { "j" }, flags);
        assert!(out.status.success());
        assert!(
            out.stderr.is_empty(),
            "{flags:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(out.stdout, plain.stdout, "{flags:?}: the same final line");
    }
}
