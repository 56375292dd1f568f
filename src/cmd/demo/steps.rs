//! The demo's steps, in order: pack, inspect, the uninterrupted run, the aborted run,
//! what the crash left, the resumed run, and the final comparisons. Invariant: every
//! step records its checks and returns false when a later step would have nothing to
//! work on, so the report says where the demo stopped.

use std::fs;

use anyhow::Context;
use serde_json::Value;

use super::children::{aborted, describe, find, stdout_text, train_args, Children};
use super::*;
use tlio_core::checkpoint::step_name;

/// Every step of the demo, in order. Returns false early (with the failed check
/// recorded) when a later step would have nothing to work on.
pub(super) fn steps(
    ch: &Children,
    checks: &mut Checks,
    report: &mut Report,
) -> anyhow::Result<bool> {
    let corpus = ch.dir.join("corpus.txt");
    tlio_core::atomic::write_file(&corpus, CORPUS)
        .with_context(|| format!("cannot write {}", corpus.display()))?;
    if !pack_shard(ch, checks)? || !inspect_shard(ch, checks)? {
        return Ok(false);
    }
    let Some((line_a, final_a)) = uninterrupted_run(ch, checks, report)? else {
        return Ok(false);
    };
    let res_args = train_args(RESUMED);
    let res_refs: Vec<&str> = res_args.iter().map(String::as_str).collect();
    if !aborted_run(ch, checks, report, &res_refs)? {
        return Ok(false);
    }
    let Some(last_saved) = crash_leftover(ch, checks)? else {
        return Ok(false);
    };
    if !resumed_run(ch, checks, report, &res_refs, last_saved, &line_a)? {
        return Ok(false);
    }
    report.final_line = final_a;
    report.final_line_text = Some(line_a);
    compare_final_files(ch, checks)?;
    verify_dirs(ch, checks)?;
    Ok(true)
}

/// Step 1: the built-in corpus packed into a shard (every byte is a token).
pub(super) fn pack_shard(ch: &Children, checks: &mut Checks) -> anyhow::Result<bool> {
    ch.stage("packing the built-in corpus into a token shard");
    let pack = ["tokens", "pack", "corpus.txt", "-o", SHARD];
    let out = ch.run(&pack, None)?;
    if !checks.add(
        "tokens pack: corpus into a shard",
        out.status.success(),
        format!("{} bytes -> {SHARD}", CORPUS.len()),
    ) {
        ch.show_failure(&pack, &out);
        return Ok(false);
    }

    Ok(true)
}

/// Step 2: the shard's header validates and counts every byte.
pub(super) fn inspect_shard(ch: &Children, checks: &mut Checks) -> anyhow::Result<bool> {
    let header = ["tokens", "header", SHARD, "--json"];
    let out = ch.run(&header, None)?;
    let doc: Option<Value> = serde_json::from_slice(&out.stdout).ok();
    let n = doc
        .as_ref()
        .and_then(|d| find(d, "n"))
        .and_then(Value::as_u64);
    let vocab = doc
        .as_ref()
        .and_then(|d| find(d, "vocab_size"))
        .and_then(Value::as_u64);
    let ok = out.status.success() && n == Some(CORPUS.len() as u64) && vocab == Some(VOCAB);
    if !checks.add(
        "tokens header: shard validates",
        ok,
        format!(
            "n = {}, V = {}",
            n.map_or("?".into(), |n| n.to_string()),
            vocab.map_or("?".into(), |v| v.to_string())
        ),
    ) {
        ch.show_failure(&header, &out);
        return Ok(false);
    }

    Ok(true)
}

/// Step 3: the uninterrupted run; its final line (text and parsed).
pub(super) fn uninterrupted_run(
    ch: &Children,
    checks: &mut Checks,
    report: &mut Report,
) -> anyhow::Result<Option<(String, Option<Value>)>> {
    ch.stage(&format!("training {STEPS} steps uninterrupted"));
    let full_args = train_args(FULL);
    let full_refs: Vec<&str> = full_args.iter().map(String::as_str).collect();
    let out = ch.run(&full_refs, None)?;
    let line_a = stdout_text(&out);
    let final_a: Option<Value> = serde_json::from_str(&line_a).ok();
    let loss_a = final_a
        .as_ref()
        .and_then(|v| v.get("loss"))
        .and_then(Value::as_f64);
    let step_a = final_a
        .as_ref()
        .and_then(|v| v.get("step"))
        .and_then(Value::as_u64);
    report.runs.push(Run {
        run: "uninterrupted".into(),
        steps: format!("1-{STEPS}"),
        loss: loss_a,
    });
    if !checks.add(
        "train: uninterrupted run",
        out.status.success() && step_a == Some(STEPS),
        format!(
            "step {}, loss {}",
            step_a.map_or("?".into(), |s| s.to_string()),
            loss_a.map_or("?".into(), |l| format!("{l:.4}"))
        ),
    ) {
        ch.show_failure(&full_refs, &out);
        return Ok(None);
    }
    // An unreadable final.json fails the check with the reason, never as empty text.
    let (same, detail) = match fs::read(ch.dir.join(FULL).join("final.json")) {
        Ok(saved) => (
            saved.strip_suffix(b"\n").unwrap_or(&saved) == line_a.as_bytes(),
            format!("{FULL}/final.json"),
        ),
        Err(e) => (false, format!("{FULL}/final.json: {e}")),
    };
    checks.add("train: final.json = the final line", same, detail);
    let ln_v = (VOCAB as f64).ln();
    checks.add(
        "train: the loss fell",
        loss_a.is_some_and(|l| l < ln_v),
        format!(
            "{} < ln {VOCAB} = {ln_v:.4}",
            loss_a.map_or("?".into(), |l| format!("{l:.4}"))
        ),
    );

    Ok(Some((line_a, final_a)))
}

/// Step 4: the same run, aborted by the failpoint right after step ABORT_AFTER + 1.
pub(super) fn aborted_run(
    ch: &Children,
    checks: &mut Checks,
    report: &mut Report,
    res_refs: &[&str],
) -> anyhow::Result<bool> {
    ch.stage(&format!(
        "training the same run, aborted after step {}",
        ABORT_AFTER + 1
    ));
    let spec = format!("train/after-step={ABORT_AFTER}*off->return");
    let out = ch.run(res_refs, Some(&spec))?;
    let no_final = !ch.dir.join(RESUMED).join("final.json").exists();
    report.runs.push(Run {
        run: "aborted by failpoint".into(),
        steps: format!("1-{}, then abort()", ABORT_AFTER + 1),
        loss: None,
    });
    if !checks.add(
        "failpoint: run aborted mid-way",
        aborted(&out.status) && out.stdout.is_empty() && no_final,
        format!("FAILPOINTS='{spec}': ended by {}", describe(&out.status)),
    ) {
        ch.show_failure(res_refs, &out);
        return Ok(false);
    }

    Ok(true)
}

/// Step 5: what the crash left, the newest checkpoint before the abort; its step.
pub(super) fn crash_leftover(ch: &Children, checks: &mut Checks) -> anyhow::Result<Option<u64>> {
    let ckpt = format!("{RESUMED}/ckpt");
    let latest = ["ckpt", "latest", ckpt.as_str()];
    let out = ch.run(&latest, None)?;
    let picked = stdout_text(&out);
    let last_saved = ((ABORT_AFTER + 1) / CKPT_EVERY) * CKPT_EVERY;
    let ok = out.status.success() && picked.ends_with(&step_name(last_saved));
    if !checks.add(
        "ckpt latest: crash left a loadable checkpoint",
        ok,
        if picked.is_empty() {
            "none".to_string()
        } else {
            picked.clone()
        },
    ) {
        ch.show_failure(&latest, &out);
        return Ok(None);
    }

    Ok(Some(last_saved))
}

/// Step 6: resume the aborted run; its final line must equal the uninterrupted one's.
pub(super) fn resumed_run(
    ch: &Children,
    checks: &mut Checks,
    report: &mut Report,
    res_refs: &[&str],
    last_saved: u64,
    line_a: &str,
) -> anyhow::Result<bool> {
    ch.stage(&format!("resuming from step {last_saved}"));
    let mut resume_refs = res_refs.to_vec();
    resume_refs.push("--resume");
    let out = ch.run(&resume_refs, None)?;
    let line_b = stdout_text(&out);
    let final_b: Option<Value> = serde_json::from_str(&line_b).ok();
    let loss_b = final_b
        .as_ref()
        .and_then(|v| v.get("loss"))
        .and_then(Value::as_f64);
    report.runs.push(Run {
        run: "resumed".into(),
        steps: format!("{}-{STEPS}", last_saved + 1),
        loss: loss_b,
    });
    if !checks.add(
        "train --resume: run completed",
        out.status.success() && final_b.is_some(),
        format!("from {}", step_name(last_saved)),
    ) {
        ch.show_failure(&resume_refs, &out);
        return Ok(false);
    }
    checks.add(
        "final lines byte-identical",
        !line_a.is_empty() && line_a == line_b,
        format!("{} bytes each", line_a.len()),
    );

    Ok(true)
}

/// Step 7: the final models and optimizer states, bitwise.
pub(super) fn compare_final_files(ch: &Children, checks: &mut Checks) -> anyhow::Result<()> {
    let last = step_name(STEPS);
    for file in ["model.safetensors", "optimizer.safetensors"] {
        let a = format!("{FULL}/ckpt/{last}/{file}");
        let b = format!("{RESUMED}/ckpt/{last}/{file}");
        let diff = ["st", "diff", a.as_str(), b.as_str()];
        let out = ch.run(&diff, None)?;
        if !checks.add(
            &format!("st diff: final {file} bitwise equal"),
            out.status.success(),
            describe(&out.status),
        ) {
            ch.show_failure(&diff, &out);
        }
    }

    Ok(())
}

/// Step 8: the checkpoint directories as a whole.
pub(super) fn verify_dirs(ch: &Children, checks: &mut Checks) -> anyhow::Result<()> {
    for run in [FULL, RESUMED] {
        let ckpt = format!("{run}/ckpt");
        let verify = ["ckpt", "verify", ckpt.as_str()];
        let out = ch.run(&verify, None)?;
        if !checks.add(
            &format!("ckpt verify: {run}"),
            out.status.success(),
            describe(&out.status),
        ) {
            ch.show_failure(&verify, &out);
        }
    }
    Ok(())
}
