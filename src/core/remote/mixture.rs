//! A mixture's sources opened from what a user names (local paths, `*` patterns,
//! manifests, `s3://` URLs), for the CLI and the binding alike.
//!
//! Invariants: the shape, the ranks and the stages are checked before any shard is
//! opened (a typo in a weight reads nothing); each source's entries are expanded in
//! order and its shards opened and validated as a single stream's are.

use std::path::PathBuf;

use super::RemoteError;
use crate::pcg::Pcg32;
use crate::tokens::{
    check_batch_shape, check_ranks, check_stages, expand_source, Mixture, MixtureOptions,
    MixtureSource, Stage,
};

/// One source as named: a name for messages and its entries.
pub type NamedSource = (String, Vec<PathBuf>);

/// Open each source: local `*` patterns expanded, `s3://` sources fetched through the
/// verified cache, every shard validated.
pub fn open_sources(
    sources: &[NamedSource],
    vocab: Option<u32>,
) -> Result<Vec<MixtureSource>, RemoteError> {
    let mut out = Vec::with_capacity(sources.len());
    for (name, entries) in sources {
        let mut paths = Vec::new();
        for entry in entries {
            paths.extend(expand_source(entry)?);
        }
        let shards = super::open_shards(&paths, vocab)?;
        out.push(MixtureSource {
            name: name.clone(),
            shards,
        });
    }
    Ok(out)
}

/// The mixture of `sources` under `stages`: shape, ranks and stages checked first,
/// then the sources opened ([`open_sources`]) and [`Mixture::new`] built.
pub fn open_mixture(
    sources: &[NamedSource],
    stages: &[Stage],
    (seq_len, batch): (usize, usize),
    rng: Pcg32,
    vocab: Option<u32>,
    options: MixtureOptions,
) -> Result<Mixture, RemoteError> {
    check_batch_shape(seq_len, batch)?;
    check_ranks(batch, options.ranks)?;
    check_stages(stages, sources.len())?;
    let opened = open_sources(sources, vocab)?;
    Ok(Mixture::new(
        opened, stages, seq_len, batch, rng, vocab, options,
    )?)
}
