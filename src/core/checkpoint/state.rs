//! `trainer_state.json`: the schema of checkpoint.md, parsed strictly and written
//! deterministically.
//!
//! Invariants: every key is always written, in the spec's order, with 64-bit generator
//! words as 16 lowercase hex digits (no JSON reader rounds them) and an odd increment;
//! a value that breaks the schema is refused before anything reaches the disk.

use serde::{Deserialize, Deserializer, Serialize};

use crate::digest::is_lower_hex;
pub use crate::digest::SHA256_HEX_LEN;
/// Length of a sha1 git object id in hex.
pub const GIT_SHA1_HEX_LEN: usize = 40;
/// Length of a sha256 git object id in hex.
pub const GIT_SHA256_HEX_LEN: usize = 64;
/// Where the token stream continues (`data_cursor`: shard, offset of the next window,
/// and the global batch of a stream with ranks), one type with the stream's cursor.
pub use crate::cursor::{Cursor, DataCursor};
/// The PCG32 generator's whole position (tokens.md), defined with the generator and
/// read and written by its one codec.
pub use crate::pcg::RngState;

/// The training loop's position, as stored in `trainer_state.json`.
#[derive(Debug, Clone, PartialEq)]
pub struct TrainerState {
    /// The optimizer step the checkpoint was taken at.
    pub step: u64,
    /// Tokens consumed so far (0 when the caller does not say).
    pub tokens_seen: u64,
    /// The token stream's cursor, when the run reads a stream.
    pub data_cursor: Option<DataCursor>,
    /// The generator's state, when the run uses one.
    pub rng_state: Option<RngState>,
    /// The learning rate at this step.
    pub lr: Option<f64>,
    /// sha256 of `config.json` (lowercase hex); filled in from the config when absent.
    pub config_sha256: Option<String>,
    /// The git commit of the code (40 or 64 lowercase hex digits).
    pub git_sha: Option<String>,
}

/// Why a trainer state was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum StateError {
    /// The JSON does not match the schema (unknown key, negative or fractional integer,
    /// wrong type, duplicate key, trailing bytes).
    #[error("{0}")]
    Schema(String),
    /// A key the schema requires in a stored checkpoint is missing.
    #[error("missing key `{0}`")]
    Missing(&'static str),
    /// `rng_state.inc` is even, which no PCG32 stream has.
    #[error("rng_state.inc {0:016x} is even; a PCG32 increment is always odd")]
    EvenIncrement(u64),
    /// A hex field has the wrong length or alphabet.
    #[error("{field} must be {expected} lowercase hex digits, got {got:?}")]
    BadHex {
        /// The key.
        field: &'static str,
        /// The required description of the length.
        expected: &'static str,
        /// The offending value.
        got: String,
    },
    /// `lr` is NaN or infinite (JSON cannot hold it).
    #[error("lr must be a finite number, got {0}")]
    NonFiniteLr(f64),
    /// `config_sha256` disagrees with the config stored alongside.
    #[error("config_sha256 {stated} disagrees with the config's sha256 {actual}")]
    ConfigMismatch {
        /// What the state says.
        stated: String,
        /// The sha256 of the config bytes.
        actual: String,
    },
}

impl crate::failure::Failure for StateError {
    fn kind(&self) -> crate::failure::FailureKind {
        match self {
            StateError::Schema(_)
            | StateError::Missing(_)
            | StateError::EvenIncrement(_)
            | StateError::BadHex { .. }
            | StateError::NonFiniteLr(_)
            | StateError::ConfigMismatch { .. } => crate::failure::FailureKind::Invalid,
        }
    }
}

impl TrainerState {
    /// A state at `step` with every other field at its default.
    pub fn new(step: u64) -> Self {
        TrainerState {
            step,
            tokens_seen: 0,
            data_cursor: None,
            rng_state: None,
            lr: None,
            config_sha256: None,
            git_sha: None,
        }
    }

    /// The stream's cursor, when the state holds both its halves (`data_cursor` and
    /// `rng_state`).
    pub fn cursor(&self) -> Option<Cursor> {
        Some(Cursor::from_parts(self.data_cursor?, self.rng_state?))
    }

    /// Store a stream's cursor as `data_cursor` and `rng_state`.
    pub fn set_cursor(&mut self, cursor: Cursor) {
        self.data_cursor = Some(cursor.data());
        self.rng_state = Some(cursor.rng);
    }

    /// Check every rule of the schema that the types do not already enforce.
    pub fn validate(&self) -> Result<(), StateError> {
        if let Some(rng) = self.rng_state {
            if rng.inc & 1 == 0 {
                return Err(StateError::EvenIncrement(rng.inc));
            }
        }
        if let Some(lr) = self.lr {
            if !lr.is_finite() {
                return Err(StateError::NonFiniteLr(lr));
            }
        }
        if let Some(sha) = &self.config_sha256 {
            if !is_lower_hex(sha, SHA256_HEX_LEN) {
                return Err(StateError::BadHex {
                    field: "config_sha256",
                    expected: "64",
                    got: sha.clone(),
                });
            }
        }
        if let Some(sha) = &self.git_sha {
            if !(is_lower_hex(sha, GIT_SHA1_HEX_LEN) || is_lower_hex(sha, GIT_SHA256_HEX_LEN)) {
                return Err(StateError::BadHex {
                    field: "git_sha",
                    expected: "40 or 64",
                    got: sha.clone(),
                });
            }
        }
        Ok(())
    }

    /// Validate against the config stored with the state: fill `config_sha256` in
    /// from `config_sha` when the caller left it out, refuse a disagreement.
    pub fn bind_config(&mut self, config_sha: Option<&str>) -> Result<(), StateError> {
        self.validate()?;
        match (config_sha, &self.config_sha256) {
            (Some(actual), None) => self.config_sha256 = Some(actual.to_string()),
            (Some(actual), Some(stated)) if stated != actual => {
                return Err(StateError::ConfigMismatch {
                    stated: stated.clone(),
                    actual: actual.to_string(),
                })
            }
            _ => {}
        }
        Ok(())
    }

    /// The canonical bytes of `trainer_state.json`: pretty JSON, every key in the
    /// spec's order, a final newline. Validates first.
    pub fn to_json(&self) -> Result<Vec<u8>, StateError> {
        self.validate()?;
        let wire = WireState {
            step: self.step,
            tokens_seen: self.tokens_seen,
            data_cursor: self.data_cursor,
            rng_state: self.rng_state,
            lr: self.lr,
            config_sha256: self.config_sha256.clone(),
            git_sha: self.git_sha.clone(),
        };
        let mut bytes =
            serde_json::to_vec_pretty(&wire).map_err(|e| StateError::Schema(e.to_string()))?;
        bytes.push(b'\n');
        Ok(bytes)
    }

    /// Parse a stored `trainer_state.json`: every key must be present.
    pub fn from_json(bytes: &[u8]) -> Result<Self, StateError> {
        Self::parse(bytes, true)
    }

    /// Parse a state given by a caller (`ckpt save --state`): missing keys take their
    /// defaults, everything else is as strict as `from_json`.
    pub fn from_json_with_defaults(bytes: &[u8]) -> Result<Self, StateError> {
        Self::parse(bytes, false)
    }

    fn parse(bytes: &[u8], require_all: bool) -> Result<Self, StateError> {
        // serde's derive also accepts a struct written as an array; the schema is
        // objects only.
        let value: serde_json::Value =
            serde_json::from_slice(bytes).map_err(|e| StateError::Schema(e.to_string()))?;
        let object_or_null =
            |v: Option<&serde_json::Value>| v.is_none_or(|v| v.is_object() || v.is_null());
        if !value.is_object()
            || !object_or_null(value.get("data_cursor"))
            || !object_or_null(value.get("rng_state"))
        {
            return Err(StateError::Schema(
                "the state and its data_cursor and rng_state must be JSON objects".into(),
            ));
        }
        let raw: RawState =
            serde_json::from_slice(bytes).map_err(|e| StateError::Schema(e.to_string()))?;
        fn need<T>(v: Option<T>, key: &'static str, all: bool) -> Result<Option<T>, StateError> {
            match v {
                None if all => Err(StateError::Missing(key)),
                other => Ok(other),
            }
        }
        let not_null = |v: Option<Option<u64>>, key: &str| match v {
            Some(None) => Err(StateError::Schema(format!(
                "{key} must be an integer, not null"
            ))),
            Some(Some(n)) => Ok(Some(n)),
            None => Ok(None),
        };
        let step = not_null(raw.step, "step")?.ok_or(StateError::Missing("step"))?;
        let tokens_seen = need(
            not_null(raw.tokens_seen, "tokens_seen")?,
            "tokens_seen",
            require_all,
        )?
        .unwrap_or(0);
        let data_cursor = need(raw.data_cursor, "data_cursor", require_all)?.flatten();
        let rng_state = need(raw.rng_state, "rng_state", require_all)?.flatten();
        let lr = need(raw.lr, "lr", require_all)?.flatten();
        let config_sha256 = need(raw.config_sha256, "config_sha256", require_all)?.flatten();
        let git_sha = need(raw.git_sha, "git_sha", require_all)?.flatten();
        let state = TrainerState {
            step,
            tokens_seen,
            data_cursor,
            rng_state,
            lr,
            config_sha256,
            git_sha,
        };
        state.validate()?;
        Ok(state)
    }
}

#[derive(Serialize)]
struct WireState {
    step: u64,
    tokens_seen: u64,
    data_cursor: Option<DataCursor>,
    rng_state: Option<RngState>,
    lr: Option<f64>,
    config_sha256: Option<String>,
    git_sha: Option<String>,
}

/// Distinguishes a missing key (`None`) from an explicit `null` (`Some(None)`).
fn present<'de, D, T>(d: D) -> Result<Option<Option<T>>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    Option::<T>::deserialize(d).map(Some)
}

/// The wire form as read; `deny_unknown_fields` refuses unknown keys and serde's
/// derive refuses duplicate ones. Integers are `u64`, so `-1`, `1.5` and `1e3` fail.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawState {
    #[serde(default, deserialize_with = "present")]
    step: Option<Option<u64>>,
    #[serde(default, deserialize_with = "present")]
    tokens_seen: Option<Option<u64>>,
    #[serde(default, deserialize_with = "present")]
    data_cursor: Option<Option<DataCursor>>,
    #[serde(default, deserialize_with = "present")]
    rng_state: Option<Option<RngState>>,
    #[serde(default, deserialize_with = "present")]
    lr: Option<Option<f64>>,
    #[serde(default, deserialize_with = "present")]
    config_sha256: Option<Option<String>>,
    #[serde(default, deserialize_with = "present")]
    git_sha: Option<Option<String>>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn full() -> TrainerState {
        TrainerState {
            step: 50,
            tokens_seen: 102400,
            data_cursor: Some(DataCursor {
                shard: 0,
                offset: 1234,
                global_batch: None,
                epoch_rng: None,
            }),
            rng_state: Some(RngState {
                state: 0x185706b82c2e03f8,
                inc: 0x6d,
            }),
            lr: Some(0.01),
            config_sha256: Some("ab".repeat(32)),
            git_sha: Some("0123456789abcdef0123456789abcdef01234567".into()),
        }
    }

    #[test]
    fn writes_the_spec_layout_and_reads_it_back() {
        let bytes = full().to_json().unwrap();
        let text = String::from_utf8(bytes.clone()).unwrap();
        assert!(text.contains("\"state\": \"185706b82c2e03f8\""));
        assert!(text.contains("\"inc\": \"000000000000006d\""));
        let keys: Vec<usize> = [
            "\"step\"",
            "\"tokens_seen\"",
            "\"data_cursor\"",
            "\"rng_state\"",
            "\"lr\"",
            "\"config_sha256\"",
            "\"git_sha\"",
        ]
        .iter()
        .map(|k| text.find(k).unwrap())
        .collect();
        assert!(keys.windows(2).all(|w| w[0] < w[1]), "{text}");
        assert_eq!(TrainerState::from_json(&bytes).unwrap(), full());
    }

    #[test]
    fn defaults_write_every_key_as_null_or_zero() {
        let text = String::from_utf8(TrainerState::new(3).to_json().unwrap()).unwrap();
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"step":3,"tokens_seen":0,"data_cursor":null,"rng_state":null,
                "lr":null,"config_sha256":null,"git_sha":null})
        );
        let s = TrainerState::from_json_with_defaults(b"{\"step\": 3}").unwrap();
        assert_eq!(s, TrainerState::new(3));
        assert_eq!(
            TrainerState::from_json(b"{\"step\": 3}"),
            Err(StateError::Missing("tokens_seen"))
        );
    }

    #[test]
    fn refuses_what_the_schema_forbids() {
        let bad: &[&str] = &[
            r#"{"step": -1}"#,
            r#"{"step": 1.5}"#,
            r#"{"step": 1e3}"#,
            r#"{"step": "1"}"#,
            r#"{"step": 1, "extra": 0}"#,
            r#"{"step": 1, "step": 2}"#,
            r#"{"step": 1, "tokens_seen": -5}"#,
            r#"{"step": 1, "tokens_seen": null}"#,
            r#"{"step": 1, "data_cursor": {"shard": 0, "offset": -1}}"#,
            r#"{"step": 1, "data_cursor": {"shard": 0.5, "offset": 1}}"#,
            r#"{"step": 1, "data_cursor": {"shard": 0, "offset": 1, "x": 1}}"#,
            r#"{"step": 1, "rng_state": {"state": "185706b82c2e03f8", "inc": "000000000000006c"}}"#,
            r#"{"step": 1, "rng_state": {"state": "185706B82C2E03F8", "inc": "000000000000006d"}}"#,
            r#"{"step": 1, "rng_state": {"state": "85706b82c2e03f8", "inc": "000000000000006d"}}"#,
            r#"{"step": 1, "rng_state": {"state": 1, "inc": "000000000000006d"}}"#,
            r#"{"step": 1, "git_sha": "abc123"}"#,
            r#"{"step": 1, "git_sha": "0123456789ABCDEF0123456789abcdef01234567"}"#,
            r#"{"step": 1, "config_sha256": "00"}"#,
            r#"{"tokens_seen": 1}"#,
            r#"[1]"#,
            r#"[1, 2, null, null, null, null, null]"#,
            r#"{"step": 1, "data_cursor": [0, 6]}"#,
            r#"{"step": 1, "rng_state": ["185706b82c2e03f8", "000000000000006d"]}"#,
            r#"{"step": 1} x"#,
        ];
        for text in bad {
            assert!(
                TrainerState::from_json_with_defaults(text.as_bytes()).is_err(),
                "accepted {text}"
            );
        }
    }

    /// `data_cursor` may carry the stream's `global_batch` (a positive integer, written
    /// only when present); anything else there is refused.
    #[test]
    fn data_cursor_global_batch() {
        let ok = r#"{"step": 1, "data_cursor": {"shard": 0, "offset": 6, "global_batch": 16}}"#;
        let s = TrainerState::from_json_with_defaults(ok.as_bytes()).unwrap();
        let dc = s.data_cursor.unwrap();
        assert_eq!(dc.global_batch.map(|g| g.get()), Some(16));
        let text = String::from_utf8(s.to_json().unwrap()).unwrap();
        assert!(text.contains("\"global_batch\": 16"), "{text}");
        assert_eq!(TrainerState::from_json(text.as_bytes()).unwrap(), s);
        let plain = String::from_utf8(full().to_json().unwrap()).unwrap();
        assert!(!plain.contains("global_batch"), "{plain}");
        for bad in ["0", "-16", "1.5", "null", "\"16\"", "[16]"] {
            let text = format!(
                r#"{{"step": 1, "data_cursor": {{"shard": 0, "offset": 6, "global_batch": {bad}}}}}"#
            );
            assert!(
                TrainerState::from_json_with_defaults(text.as_bytes()).is_err(),
                "accepted {text}"
            );
        }
    }

    #[test]
    fn config_binding() {
        let sha = "cd".repeat(32);
        let mut s = TrainerState::new(1);
        s.bind_config(Some(&sha)).unwrap();
        assert_eq!(s.config_sha256.as_deref(), Some(sha.as_str()));
        let mut s = TrainerState::new(1);
        s.config_sha256 = Some("ef".repeat(32));
        assert!(matches!(
            s.bind_config(Some(&sha)),
            Err(StateError::ConfigMismatch { .. })
        ));
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]
        #[test]
        fn any_valid_state_roundtrips(step: u64, tokens: u64, shard: u64, offset: u64,
                                      st: u64, inc: u64, lr: f64, has: [bool; 4]) {
            let s = TrainerState {
                step,
                tokens_seen: tokens,
                data_cursor: has[0].then_some(DataCursor { shard, offset, global_batch: None, epoch_rng: None }),
                rng_state: has[1].then_some(RngState { state: st, inc: inc | 1 }),
                lr: (has[2] && lr.is_finite()).then_some(lr),
                config_sha256: has[3].then(|| format!("{:064x}", st)),
                git_sha: None,
            };
            let bytes = s.to_json().unwrap();
            let back = TrainerState::from_json(&bytes).unwrap();
            proptest::prop_assert_eq!(back.lr.map(f64::to_bits), s.lr.map(f64::to_bits));
            proptest::prop_assert_eq!(back, s);
        }
    }
}
