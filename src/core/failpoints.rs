//! The `FAILPOINTS` environment variable, parsed and validated before anything runs.
//!
//! Invariant: tlio's part of a value is applied whole or not at all. `FAILPOINTS` is
//! the `fail` crate's variable, shared by every program built with it, so an entry
//! naming a point outside tlio's groups (`ckpt/`, `model/`, `train/`) belongs to
//! another program and is ignored. A malformed entry, an unknown name inside tlio's
//! groups (a typo) or an action the crate rejects for one of tlio's points is an error
//! (the process exits 2 before doing anything), so a typo can never silently change,
//! or fail to change, a run.
//!
//! Without the crate's `failpoints` feature the points compile to nothing (the `fail`
//! crate's macro is empty), so a value naming one of tlio's points is refused rather
//! than ignored.

use crate::{Failure, FailureKind};

/// The environment variable read.
pub const ENV_VAR: &str = "FAILPOINTS";

/// Every failpoint compiled into tlio (a unit test checks the sources against it).
pub const KNOWN: &[&str] = &[
    "ckpt/fsync",
    "ckpt/remove",
    "ckpt/rename",
    "model/before-commit",
    "s3/commit",
    "s3/rank-file",
    "tokens/part-commit",
    "tokens/part-marker",
    "train/after-step",
];

/// The failpoints whose site gives `return` nothing to do (the `fail` crate would
/// panic there with "Return is not supported"), so a value asking for it is refused
/// before anything runs. Every other point of [`KNOWN`] aborts the process on
/// `return` (a crash at that instant), or fails the operation (`ckpt/remove`).
pub const NO_RETURN: &[&str] = &["model/before-commit", "tokens/part-marker"];

/// Errors of the `FAILPOINTS` value.
#[derive(Debug, thiserror::Error)]
pub enum FailpointsError {
    /// The value is not valid UTF-8.
    #[error("{ENV_VAR} is not valid UTF-8")]
    NotUtf8,
    /// An entry is not `NAME=ACTIONS`.
    #[error("{ENV_VAR}: '{entry}' is not NAME=ACTIONS (entries are separated by ';')")]
    Malformed {
        /// The entry.
        entry: String,
    },
    /// The name is in one of tlio's groups but is not one of its failpoints (a typo).
    #[error("{ENV_VAR}: unknown failpoint '{name}' (known: {})", KNOWN.join(", "))]
    Unknown {
        /// The name given.
        name: String,
    },
    /// The `fail` crate refused the actions.
    #[error("{ENV_VAR}: bad actions for '{name}': {reason}")]
    BadActions {
        /// The failpoint.
        name: String,
        /// The crate's reason.
        reason: String,
    },
    /// A non-empty value, but this build has no failpoints (the crate was built
    /// without its `failpoints` feature), so it could not take effect.
    #[error("{ENV_VAR} is set, but this build lacks the `failpoints` feature: its failpoints compile to nothing")]
    NotBuilt,
}

impl Failure for FailpointsError {
    fn kind(&self) -> FailureKind {
        // A bad environment is a usage error.
        FailureKind::Operational
    }
}

/// Whether `name` is in one of tlio's groups (the part before the first `/` of a
/// [`KNOWN`] name): tlio's to check, where any other name is another program's.
pub fn is_tlio_name(name: &str) -> bool {
    name.split_once('/').is_some_and(|(group, _)| {
        KNOWN
            .iter()
            .any(|k| k.split_once('/').is_some_and(|(g, _)| g == group))
    })
}

/// Split `spec` into tlio's `(name, actions)` pairs, checking names; entries naming
/// another program's points are left out; nothing is applied.
pub fn parse(spec: &str) -> Result<Vec<(&str, &str)>, FailpointsError> {
    let mut out = Vec::new();
    for entry in spec.split(';').map(str::trim).filter(|e| !e.is_empty()) {
        let (name, actions) = entry
            .split_once('=')
            .map(|(n, a)| (n.trim(), a.trim()))
            .filter(|(n, a)| !n.is_empty() && !a.is_empty())
            .ok_or_else(|| FailpointsError::Malformed {
                entry: entry.to_string(),
            })?;
        if !is_tlio_name(name) {
            continue;
        }
        if !KNOWN.contains(&name) {
            return Err(FailpointsError::Unknown {
                name: name.to_string(),
            });
        }
        out.push((name, actions));
    }
    Ok(out)
}

/// Configure the failpoints `spec` names; on error none stays configured.
pub fn configure(spec: &str) -> Result<(), FailpointsError> {
    let entries = parse(spec)?;
    if !cfg!(feature = "failpoints") && !entries.is_empty() {
        return Err(FailpointsError::NotBuilt);
    }
    for (name, actions) in &entries {
        if NO_RETURN.contains(name) && tasks(actions).any(|t| t == "return") {
            return Err(FailpointsError::BadActions {
                name: (*name).to_string(),
                reason: format!(
                    "return is not supported at this point (it has nothing to return there); \
                     the points that take it: {}",
                    KNOWN
                        .iter()
                        .filter(|k| !NO_RETURN.contains(k))
                        .copied()
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            });
        }
    }
    for (i, (name, actions)) in entries.iter().enumerate() {
        if let Err(reason) = fail::cfg(*name, actions) {
            for (done, _) in entries.iter().take(i) {
                fail::remove(*done);
            }
            return Err(FailpointsError::BadActions {
                name: (*name).to_string(),
                reason,
            });
        }
    }
    Ok(())
}

/// The task of each action of `actions` (`3*off->return` gives `off`, `return`):
/// each `->` step of the crate's syntax (`[P%][N*]TASK[(ARG)]`) without its `P%` and
/// `N*` prefixes and its `(ARG)`; what is not one of the crate's tasks is left for the
/// crate to refuse.
fn tasks(actions: &str) -> impl Iterator<Item = &str> {
    actions.split("->").map(|step| {
        let step = step.trim();
        let step = step.split_once('%').map_or(step, |(_, rest)| rest);
        let step = step.split_once('*').map_or(step, |(_, rest)| rest);
        step.split_once('(').map_or(step, |(task, _)| task).trim()
    })
}

/// Configure from the environment; an unset or empty variable configures nothing.
pub fn configure_from_env() -> Result<(), FailpointsError> {
    match std::env::var_os(ENV_VAR) {
        None => Ok(()),
        Some(value) => configure(value.to_str().ok_or(FailpointsError::NotUtf8)?),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_accepts_the_documented_forms_and_refuses_the_rest() {
        assert_eq!(parse("").unwrap(), []);
        assert_eq!(
            parse("train/after-step=60*off->return; ckpt/fsync=return").unwrap(),
            [
                ("train/after-step", "60*off->return"),
                ("ckpt/fsync", "return")
            ]
        );
        assert!(matches!(
            parse("garbage"),
            Err(FailpointsError::Malformed { .. })
        ));
        assert!(matches!(
            parse("ckpt/fsync="),
            Err(FailpointsError::Malformed { .. })
        ));
        assert!(matches!(
            parse("ckpt/fsnyc=return"),
            Err(FailpointsError::Unknown { .. })
        ));
    }

    #[test]
    fn another_programs_failpoints_are_ignored() {
        assert_eq!(parse("raft/append=panic").unwrap(), []);
        assert_eq!(parse("before_commit=return;x=sleep(5)").unwrap(), []);
        assert_eq!(
            parse("kv/apply=panic; ckpt/rename=return").unwrap(),
            [("ckpt/rename", "return")]
        );
        assert!(is_tlio_name("train/whatever") && !is_tlio_name("trains/after-step"));
        // Still refused: no name at all, and a typo inside tlio's groups.
        assert!(matches!(
            parse("raft/append=panic;garbage"),
            Err(FailpointsError::Malformed { .. })
        ));
        assert!(matches!(
            parse("raft/append=panic;model/before-comit=return"),
            Err(FailpointsError::Unknown { .. })
        ));
        // Actions are the other program's business: not checked, never configured.
        assert!(configure("raft/append=bogus(").is_ok());
    }

    #[test]
    fn tasks_are_read_from_every_step_of_an_action() {
        let got: Vec<&str> = tasks("3*off->return").collect();
        assert_eq!(got, ["off", "return"]);
        let got: Vec<&str> = tasks("50%2*sleep(100) -> return(x)").collect();
        assert_eq!(got, ["sleep", "return"]);
        assert_eq!(tasks("panic").collect::<Vec<_>>(), ["panic"]);
    }

    #[cfg(feature = "failpoints")]
    #[test]
    fn return_is_refused_where_its_site_cannot_return() {
        for point in NO_RETURN {
            for action in ["return", "2*off->return", "return(x)"] {
                let err = configure(&format!("{point}={action}")).unwrap_err();
                assert!(
                    matches!(&err, FailpointsError::BadActions { name, .. } if name == point),
                    "{point}={action}: {err}"
                );
            }
            assert!(configure(&format!("{point}=sleep(1)")).is_ok(), "{point}");
            fail::remove(*point);
        }
        // Refused whole: a good entry before a refused one is not configured either.
        assert!(configure("ckpt/rename=off;model/before-commit=return").is_err());
    }

    #[test]
    fn every_failpoint_that_cannot_return_is_a_known_one_whose_site_has_no_closure() {
        let root = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"));
        let re = regex::Regex::new(r#"fail_point!\(\s*"([^"]+)"\s*(,)?"#).unwrap();
        let mut without = std::collections::BTreeSet::new();
        let mut with = std::collections::BTreeSet::new();
        let mut stack = vec![root];
        while let Some(dir) = stack.pop() {
            for entry in std::fs::read_dir(&dir).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    stack.push(path);
                } else if path.extension().is_some_and(|e| e == "rs") {
                    let text = std::fs::read_to_string(&path).unwrap();
                    for cap in re.captures_iter(&text) {
                        let name = cap[1].to_string();
                        if cap.get(2).is_some() {
                            with.insert(name);
                        } else {
                            without.insert(name);
                        }
                    }
                }
            }
        }
        let no_return: std::collections::BTreeSet<String> =
            NO_RETURN.iter().map(|s| s.to_string()).collect();
        assert_eq!(
            without, no_return,
            "sites without a closure must be in NO_RETURN"
        );
        assert!(with.is_disjoint(&no_return), "{with:?}");
    }

    #[cfg(feature = "failpoints")]
    #[test]
    fn configure_refuses_actions_the_fail_crate_refuses() {
        assert!(matches!(
            configure("ckpt/rename=bogus(1)"),
            Err(FailpointsError::BadActions { .. })
        ));
    }

    #[cfg(not(feature = "failpoints"))]
    #[test]
    fn without_the_feature_a_named_failpoint_is_refused() {
        assert!(configure("").is_ok());
        assert!(configure(" ; ").is_ok());
        assert!(configure("raft/append=panic").is_ok());
        let err = configure("ckpt/fsync=return").unwrap_err();
        assert!(matches!(err, FailpointsError::NotBuilt), "{err}");
        // A typo is still reported as one.
        assert!(matches!(
            configure("ckpt/fsnyc=return"),
            Err(FailpointsError::Unknown { .. })
        ));
    }

    #[test]
    fn every_failpoint_in_the_sources_is_known() {
        let root = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"));
        let re = regex::Regex::new(r#"fail_point!\(\s*"([^"]+)""#).unwrap();
        let mut stack = vec![root];
        let mut found = 0;
        while let Some(dir) = stack.pop() {
            for entry in std::fs::read_dir(&dir).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    stack.push(path);
                } else if path.extension().is_some_and(|e| e == "rs") {
                    let text = std::fs::read_to_string(&path).unwrap();
                    for cap in re.captures_iter(&text) {
                        found += 1;
                        assert!(
                            KNOWN.contains(&&cap[1]),
                            "{} in {}",
                            &cap[1],
                            path.display()
                        );
                    }
                }
            }
        }
        assert!(found >= KNOWN.len());
    }
}
