//! `verify`: every reader rule, and optionally canonical bytes and finite values, with
//! one finding per broken rule naming the rule and the tensor.
//!
//! Invariant: an invalid file yields findings, never an error; only operational
//! failures (missing file, unreadable) are errors.

use std::io::Read;
use std::path::Path;

use super::header::{Header, N_LEN};
use super::stats::non_finite;
use super::write::{canonical_header, TensorSpec};
use super::{read_header, MappedFile, SafetensorsError};
use crate::text::quote;

/// What to check beyond the reader rules.
#[derive(Debug, Clone, Copy, Default)]
pub struct VerifyOptions {
    /// Require the bytes the canonical writer would write.
    pub canonical: bool,
    /// Require no NaN or infinity in float tensors.
    pub finite: bool,
}

/// One broken rule.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Finding {
    /// Stable rule identifier (`rule-4-dtype`, `canonical`, `finite`, ...).
    pub rule: String,
    /// The tensor concerned, when there is one.
    pub tensor: Option<String>,
    /// The full message (starts with the rule).
    pub message: String,
}

impl Finding {
    /// The finding of a reader-rule error; `None` for an operational one (I/O).
    pub fn from_error(e: &SafetensorsError) -> Option<Finding> {
        Some(Finding {
            rule: e.rule()?.to_string(),
            tensor: e.tensor().map(str::to_string),
            message: e.to_string(),
        })
    }
}

/// The findings kept per file: a broken config (a million layers) or a huge index can
/// break a rule millions of times, and holding every message would need gigabytes; the
/// rest are only counted.
pub const MAX_FINDINGS_PER_FILE: usize = 1000;

/// The findings of one file: the first [`MAX_FINDINGS_PER_FILE`] in full, the rest
/// counted (so memory stays bounded whatever the input).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Findings {
    kept: Vec<Finding>,
    more: u64,
}

impl Findings {
    /// No finding yet.
    pub fn new() -> Findings {
        Findings::default()
    }

    /// Record `f`: kept while fewer than the limit are kept, else counted.
    pub fn push(&mut self, f: Finding) {
        if self.kept.len() < MAX_FINDINGS_PER_FILE {
            self.kept.push(f);
        } else {
            self.more = self.more.saturating_add(1);
        }
    }

    /// Every finding recorded, kept or counted.
    pub fn len(&self) -> u64 {
        (self.kept.len() as u64).saturating_add(self.more)
    }

    /// True when nothing broke a rule.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The findings kept, in order.
    pub fn kept(&self) -> &[Finding] {
        &self.kept
    }

    /// How many findings were counted but not kept.
    pub fn more(&self) -> u64 {
        self.more
    }

    /// The findings kept, and the count of the rest.
    pub fn into_parts(self) -> (Vec<Finding>, u64) {
        (self.kept, self.more)
    }
}

impl Extend<Finding> for Findings {
    fn extend<I: IntoIterator<Item = Finding>>(&mut self, iter: I) {
        for f in iter {
            self.push(f);
        }
    }
}

/// Check `path`; an empty list means it passed everything asked for.
pub fn verify(path: &Path, opts: VerifyOptions) -> Result<Vec<Finding>, SafetensorsError> {
    verify_with_progress(path, opts, &mut |_, _| {})
}

/// [`verify`], reporting `progress(done, total)` in data bytes while `--finite` scans.
pub fn verify_with_progress(
    path: &Path,
    opts: VerifyOptions,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<Vec<Finding>, SafetensorsError> {
    let header = match read_header(path) {
        Ok(h) => h,
        Err(e) => return Finding::from_error(&e).map(|f| vec![f]).ok_or(e),
    };
    let mut findings = Vec::new();
    if opts.canonical {
        let io = |source| SafetensorsError::Io {
            path: path.to_path_buf(),
            source,
        };
        // The header length was validated against the file size and the limit.
        let mut raw = vec![0u8; header.data_start() as usize];
        crate::files::open_regular(path)
            .and_then(|mut f| f.read_exact(&mut raw))
            .map_err(io)?;
        if let Some(f) = canonical_mismatch(&header, &raw)? {
            findings.push(f);
        }
    }
    if opts.finite {
        let file = MappedFile::open(path)?;
        let total = file.header().data_len();
        for info in file.header().tensors() {
            let Some(bytes) = file.info_bytes(info) else {
                continue;
            };
            let (nan, inf, first) = non_finite(info, bytes);
            progress(info.data_offsets.1, total);
            if let Some(first) = first {
                findings.push(Finding {
                    rule: "finite".to_string(),
                    tensor: Some(info.name.clone()),
                    message: format!(
                        "finite: tensor {}: {nan} NaN and {inf} infinite values, the first at index {first}",
                        quote(&info.name)
                    ),
                });
            }
        }
    }
    Ok(findings)
}

/// Compare the first `8 + N` bytes of a valid file with what the canonical writer
/// would write for the same tensors and metadata.
pub fn canonical_mismatch(
    header: &Header,
    raw: &[u8],
) -> Result<Option<Finding>, SafetensorsError> {
    let specs: Vec<TensorSpec<'_>> = header
        .tensors()
        .iter()
        .map(|t| TensorSpec::from_info(t, t.dtype))
        .collect();
    let layout = match canonical_header(&specs, &header.metadata) {
        Ok(l) => l,
        // A name the writer refuses (`__metadata__` cannot reach here; duplicates
        // neither): report it as the canonical finding.
        Err(e) => {
            return Ok(Some(Finding {
                rule: "canonical".to_string(),
                tensor: e.tensor().map(str::to_string),
                message: format!("canonical: {e}"),
            }))
        }
    };
    let finding = |tensor: Option<&str>, detail: String| Finding {
        rule: "canonical".to_string(),
        tensor: tensor.map(str::to_string),
        message: format!("canonical: {detail}"),
    };
    // The layout's offsets are indexed like the specs, which are the header's tensors.
    for (t, &want) in header.tensors().iter().zip(&layout.offsets) {
        if t.data_offsets != want {
            return Ok(Some(finding(
                Some(&t.name),
                format!(
                    "tensor {}: at {:?}, but canonical order (dtype rank, then name) puts it at {:?}",
                    quote(&t.name),
                    t.data_offsets,
                    want
                ),
            )));
        }
    }
    if layout.header.as_slice() != raw {
        let at = layout
            .header
            .iter()
            .zip(raw)
            .position(|(a, b)| a != b)
            .unwrap_or(layout.header.len().min(raw.len()));
        let detail = if at < N_LEN as usize {
            format!(
                "the header length is {}, the canonical header is {} bytes",
                header.header_len,
                layout.header.len() as u64 - N_LEN
            )
        } else {
            format!(
                "the header text differs from the canonical one at header byte {} (spacing, key order, escapes or padding)",
                at - N_LEN as usize
            )
        };
        return Ok(Some(finding(None, detail)));
    }
    Ok(None)
}

#[cfg(test)]
mod findings_tests {
    use super::*;

    #[test]
    fn findings_keep_the_first_ones_and_count_the_rest() {
        let mut f = Findings::new();
        assert!(f.is_empty());
        let one = |i: usize| Finding {
            rule: "r".into(),
            tensor: None,
            message: format!("m{i}"),
        };
        f.extend((0..MAX_FINDINGS_PER_FILE + 5).map(one));
        assert_eq!(f.len(), MAX_FINDINGS_PER_FILE as u64 + 5);
        assert_eq!(f.kept().len(), MAX_FINDINGS_PER_FILE);
        assert_eq!(f.more(), 5);
        assert_eq!(f.kept().first().map(|x| x.message.as_str()), Some("m0"));
        let (kept, more) = f.into_parts();
        assert_eq!((kept.len(), more), (MAX_FINDINGS_PER_FILE, 5));
    }
}
